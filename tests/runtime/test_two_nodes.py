"""A job on a two-node Ray cluster on 127.0.0.1 (a head, and a second node joined with
`ray start --address`), reading its prompts from and writing its results to S3 (moto)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import yaml

from raydec.io import read_manifest, read_results
from raydec.io.filesystem import s3_client
from raydec.runtime import JobConfig
from tests.ray_fixture import REPO_ROOT, _free_ports, stop_own_cluster


JOIN = """
import sys
from ray._private import ray_constants
from ray.scripts import scripts
ray_constants.ENABLE_RAY_CLUSTER = True
scripts.services.resolve_ip_for_localhost = lambda host: host
sys.exit(scripts.main())
"""
"""`ray start` as its CLI runs it, for the second node. Ray 2.60 joins a node only with
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1, which also makes its processes bind every interface and swaps
127.0.0.1 for the machine's address; this allows the join and keeps the node on 127.0.0.1."""


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[dict]:
    """`ray start --head` and `ray start --address` on 127.0.0.1 only, three CPUs each; yields the
    environment of a driver for it (RAY_ADDRESS set)."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    temp_dir = tempfile.mkdtemp(prefix="rd2n", dir="/tmp")
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    ports = _free_ports(13)
    gcs = ports.pop()

    def node_ports() -> list:
        manager, objects, metrics, agent_http, agent_grpc, runtime_env = (ports.pop() for _ in range(6))
        return [f"--node-manager-port={manager}", f"--object-manager-port={objects}", f"--metrics-export-port={metrics}",
                f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
                f"--runtime-env-agent-port={runtime_env}", "--num-cpus=3", f"--temp-dir={temp_dir}",
                "--node-ip-address=127.0.0.1", "--disable-usage-stats"]

    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)  # the workers'
    try:
        subprocess.run([ray_cli, "start", "--head", f"--port={gcs}", "--include-dashboard=false", *node_ports()],
                       env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([sys.executable, "-c", JOIN, "start", f"--address=127.0.0.1:{gcs}", *node_ports()],
                       env=env, check=True, capture_output=True, timeout=120)
        yield dict(env, RAY_ADDRESS=f"127.0.0.1:{gcs}")
    finally:
        stop_own_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_job_decodes_on_both_nodes_and_writes_each_row_once(two_nodes, s3_config, s3_bucket, tmp_path):
    """The job runs as `ray job submit` runs it: a driver process given the cluster's address."""
    from tests.tiny_models import build_tiny_janus

    model = str(build_tiny_janus(tmp_path / "tiny_janus"))  # one filesystem: both nodes see the path
    ids = [f"row-{i:02d}" for i in range(16)]
    table = pa.table({"id": ids, "prompt": [f"a blue square number {i} ." for i in range(16)]})
    for half in range(2):
        path = tmp_path / f"part-{half}.parquet"
        pq.write_table(table.slice(half * 8, 8), path)
        s3_client(s3_config).put_object(Bucket=s3_bucket, Key=f"in/part-{half}.parquet", Body=path.read_bytes())
    s3 = s3_config.model_dump(mode="json", exclude_none=True)  # its dummy credentials travel in the config
    job = dict(
        task="t2i", model=model, seed=5, decode={"method": "ar"},
        input={"path": f"s3://{s3_bucket}/in/", "s3": s3}, output={"path": f"s3://{s3_bucket}/out", "s3": s3},
        pool={"workers": 2, "batch_size": 1, "cpus_per_worker": 1.5},  # 1.5 of a node's 3 CPUs: an actor on each
    )
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    done = subprocess.run([sys.executable, "jobs/t2i_batch.py", "--config", str(config)], cwd=REPO_ROOT, env=two_nodes,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    output = JobConfig.model_validate(job).output
    manifest = read_manifest(output)
    assert manifest["status"] == "complete" and manifest["counts"]["results"] == 16
    per_node = manifest["rows_per_node"]
    assert len(per_node) == 2 and all(count > 0 for count in per_node.values()) and sum(per_node.values()) == 16, per_node
    results = read_results(output).to_pylist()
    assert sorted(row["id"] for row in results) == ids and all(row["error"] is None for row in results)
    listed = s3_client(s3_config).list_objects_v2(Bucket=s3_bucket, Prefix="out/images/")["Contents"]
    assert sorted(obj["Key"] for obj in listed) == [f"out/images/{i}.png" for i in ids]
