"""`ray job submit` of jobs/t2i_batch.py against a `ray start --head` cluster on 127.0.0.1.

Slow (a head node with its dashboard, then a job driver and an actor): marked `slow`.
The cluster gets free ports and a private temp dir, and is stopped by PID, so other Ray
clusters on the machine are left alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raydec.io import OutputConfig, read_manifest, read_results
from tests.ray_fixture import REPO_ROOT, ray_head  # noqa: F401

pytestmark = pytest.mark.slow


def submit(head: dict, config: Path, timeout_s: float = 240.0, script: str = "jobs/t2i_batch.py") -> subprocess.CompletedProcess:
    """`ray job submit --working-dir <repo> -- python SCRIPT --config CONFIG`, retried while
    the head's job agent is still registering."""
    ray_cli = str(Path(sys.executable).parent / "ray")
    command = [ray_cli, "job", "submit", "--address", head["address"], "--working-dir", str(REPO_ROOT),
               "--", "python", script, "--config", str(config)]
    deadline = time.monotonic() + timeout_s
    while True:
        result = subprocess.run(command, env=head["env"], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=max(10.0, deadline - time.monotonic()))
        if "No available agent" not in result.stdout + result.stderr or time.monotonic() > deadline - 30:
            return result
        time.sleep(3)


def test_ray_job_submit_runs_the_t2i_batch_job(ray_head, tmp_path):
    from tests.tiny_models import build_tiny_janus

    model = build_tiny_janus(tmp_path / "tiny")
    prompts = tmp_path / "prompts.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "prompt": ["a red circle .", "a blue square .", ""]}), prompts)
    output = tmp_path / "out"
    config = tmp_path / "job.yaml"
    config.write_text(
        f"model: {model}\nseed: 1\ninput:\n  path: {prompts}\noutput:\n  path: {output}\n"
        "decode:\n  method: ar\npool:\n  workers: 1\n  batch_size: 4\n"
    )
    result = submit(ray_head, config)
    logs = result.stdout + result.stderr
    assert result.returncode == 0 and "succeeded" in logs.lower(), logs[-4000:]
    results = {row["id"]: row for row in read_results(OutputConfig(path=str(output))).to_pylist()}
    assert sorted(results) == ["a", "b", "c"]
    assert results["c"]["error"] == "prompt: empty"
    assert all(Path(results[i]["output_uri"]).exists() for i in ("a", "b"))
    assert read_manifest(OutputConfig(path=str(output)))["counts"]["results"] == 3

    bad = tmp_path / "bad.yaml"
    bad.write_text(config.read_text().replace("workers: 1", "wrokers: 1"))
    result = submit(ray_head, bad)
    logs = result.stdout + result.stderr
    assert result.returncode != 0 and "pool.wrokers" in logs, logs[-4000:]


def test_ray_job_submit_runs_the_caption_batch_job(ray_head, tmp_path):
    """jobs/caption_batch.py on the shipped reference LLaVA and the shipped example images."""
    output = tmp_path / "captions"
    config = tmp_path / "caption.yaml"
    config.write_text(
        f"task: caption\nmodel: reference\ninput:\n  path: {REPO_ROOT / 'examples' / 'images.parquet'}\n"
        f"output:\n  path: {output}\ndecode:\n  method: ar\n  max_new_tokens: 16\n  sampling:\n    temperature: 0.0\n"
        "pool:\n  workers: 1\n  batch_size: 8\n"
    )
    result = submit(ray_head, config, script="jobs/caption_batch.py")
    logs = result.stdout + result.stderr
    assert result.returncode == 0 and "succeeded" in logs.lower(), logs[-4000:]
    rows = read_results(OutputConfig(path=str(output))).to_pylist()
    assert len(rows) == 16 and all(r["error"] is None and r["caption"] for r in rows)


def test_local_ray_starts_once_when_threads_ask_together(monkeypatch):
    """A notebook starting jobs from threads: one thread starts Ray, the others find it up
    (two ray.init calls in one process fail). ray.init is replaced by a slow recorder here, so
    no second cluster is started beside the test session's."""
    import threading

    import ray

    from raydec.runtime import cluster

    started = []

    def slow_init(**kwargs):
        time.sleep(0.2)  # long enough for every thread to arrive while the first is starting
        started.append(kwargs)

    monkeypatch.setattr(ray, "is_initialized", lambda: bool(started))
    monkeypatch.setattr(ray, "init", slow_init)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    threads = [threading.Thread(target=cluster.init_local_ray) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(started) == 1 and started[0]["_node_ip_address"] == "127.0.0.1"
