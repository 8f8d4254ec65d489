"""Batch jobs and the app on a `ray start --head` cluster on 127.0.0.1: `ray job submit` of a job
script, and `raydec run` / `raydec serve` with each form of RAY_ADDRESS.

Slow (a head node with its dashboard, then a job driver and an actor): marked `slow`.
The cluster gets free ports and a private temp dir, and is stopped by PID, so other Ray
clusters on the machine are left alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

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


def test_raydec_run_takes_the_dashboards_address_and_the_gcs_address(ray_head, tmp_path):
    """`raydec run jobs/configs/t2i_reference.yaml` against `ray start --head`. With RAY_ADDRESS the
    dashboard's http://host:port the command runs there as a Ray job (a copy of this checkout its
    working directory) and prints the job's logs; with the GCS's host:port it drives the cluster from
    here. Two rows each (--max-rows) into one output: the first takes its shape from the shape cache
    (seeded as a tuning leaves it), the second resumes with the one the manifest records. A config
    with a bad key is refused before it is submitted."""
    output = tmp_path / "out"
    env = {**ray_head["env"], "RAYDEC_CACHE_DIR": str(tmp_path / "cache")}
    _seed_shape_cache(REPO_ROOT / "jobs/configs/t2i_reference.yaml", tmp_path / "cache")
    command = [sys.executable, "-m", "raydec.cli", "run", "jobs/configs/t2i_reference.yaml", "--output", str(output), "--max-rows", "2"]
    for address, said in ((ray_head["address"], "succeeded"), (ray_head["gcs"], "done:")):
        done = subprocess.run(command, env={**env, "RAY_ADDRESS": address}, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
        logs = done.stdout + done.stderr
        assert done.returncode == 0 and said in logs, (address, logs[-4000:])
        assert ("auto: from the shape cache" if address.startswith("http") else "auto: as the output's manifest records") in logs, logs[-4000:]
    rows = read_results(OutputConfig(path=str(output))).to_pylist()
    assert len(rows) == 4 and all(r["error"] is None and Path(r["output_uri"]).exists() for r in rows)
    assert read_manifest(OutputConfig(path=str(output)))["plan"]["label"] == "sjd_pac window=16,init=left"

    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO_ROOT / "jobs/configs/t2i_reference.yaml").read_text().replace("workers: 2", "wrokers: 2"))
    done = subprocess.run([sys.executable, "-m", "raydec.cli", "run", str(bad)], env={**env, "RAY_ADDRESS": ray_head["address"]},
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "pool.wrokers" in done.stderr and "submitted" not in done.stdout, done.stdout + done.stderr


def _seed_shape_cache(config_path: Path, cache_dir: Path) -> None:
    """Put a shape for the job in ``config_path`` into the shape cache at ``cache_dir``, under the key
    its tuning task computes (its model, weights, device and threads, dtype, batch and config), as a
    tuning would have left it: the job then takes it instead of tuning for a minute."""
    import torch

    from raydec.api import load_target, sized
    from raydec.api.draft_shapes import ShapeCache, apply_shape
    from raydec.api.tuner import ShapeTrial
    from raydec.config import DecodeConfig
    from raydec.runtime.config import JobConfig
    from raydec.runtime.planning import shape_cache_key

    config = JobConfig.from_yaml(config_path).processor_config()
    shape = {"method": "sjd_pac", "jacobi": {"window": 16, "branching": 1, "tree_depth": 0, "init": "left"}, "draft_tree": None,
             "label": "window=16,init=left"}
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)  # the tuning task's threads name its device
    try:
        key = shape_cache_key(config, sized(load_target(config.model, task="t2i", dtype=getattr(torch, config.dtype)), config.size))
    finally:
        torch.set_num_threads(threads)
    trials = [ShapeTrial(DecodeConfig(method="ar"), 10.0, 1.0), ShapeTrial(apply_shape(config.decode, shape), 12.0, 1.2)]
    ShapeCache(cache_dir / "shapes").put(key, shape, trials)


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


def test_raydec_serve_joins_by_the_gcs_address_and_runs_as_a_job_by_the_dashboards(ray_head, tmp_path):
    """`raydec serve` against `ray start --head`: with the GCS's host:port it joins the cluster, deploys
    from here and stops on SIGTERM; with the dashboard's http address it runs there as a Ray job (this folder,
    holding its config, the job's working directory) and prints its logs until Ctrl-C stops it. Each
    answers /v1/models and an image request on the config's port."""
    import signal

    from tests.serve_process import serve_until_stopped, write_serve_config

    config, port = write_serve_config(tmp_path)
    for address, stop in ((ray_head["gcs"], signal.SIGTERM), (ray_head["address"], signal.SIGINT)):
        log_path = tmp_path / f"serve-{stop.name}.log"
        serve_until_stopped(config, port, {**ray_head["env"], "RAY_ADDRESS": address}, log_path, stop, exits=(0, 130))
        if stop == signal.SIGINT:
            assert "submitted `raydec serve --config serve.yaml`" in log_path.read_text() and "stopped job" in log_path.read_text()


def test_a_cluster_whose_python_lacks_raydec_ends_the_submitted_job_in_one_line(tmp_path):
    """A head started by a python that has Ray (and torch, pyarrow: this venv's packages) but not raydec:
    `raydec run` by its dashboard's address ends with one line saying what to do, and no traceback."""
    import sysconfig

    from tests.ray_fixture import own_ray_head

    bare = tmp_path / "cluster-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    (site,) = (bare / "lib").glob("python3*/site-packages")
    (site / "project_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # its packages, not raydec's editable install
    job = tmp_path / "work" / "job.yaml"
    job.parent.mkdir()
    job.write_text((REPO_ROOT / "jobs/configs/t2i_reference.yaml").read_text())
    with own_ray_head(str(bare / "bin")) as head:
        done = subprocess.run([sys.executable, "-m", "raydec.cli", "run", "job.yaml", "--max-rows", "1"], cwd=job.parent,
                              env={**head["env"], "RAY_ADDRESS": head["address"]}, capture_output=True, text=True, timeout=300)
    said = done.stdout.strip()
    assert done.returncode == 1 and "Traceback" not in said + done.stderr, said[-3000:]
    assert said.splitlines()[-1].endswith(f"failed: the cluster's python ({bare}/bin/python) cannot import raydec: install raydec in the "
                                          "environment the cluster runs (pip install raydec, or the image its nodes start from), or start "
                                          "Ray from the environment raydec is installed in"), said[-3000:]
