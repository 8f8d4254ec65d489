"""cluster/aws-gpu.yaml, the Ray cluster-launcher config: it validates against Ray's own launcher
schema (the ray-schema.json `ray up` checks), passes the checks `ray up` runs after filling in
the AWS defaults, asks for GPU workers that hold a 7B model, and installs a CUDA torch before
raydec on every node."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "cluster" / "aws-gpu.yaml"

# AWS GPU instance types a 7B target fits on: (GPUs per instance, GB per GPU).
GPU_INSTANCES = {
    "g5.xlarge": (1, 24), "g5.2xlarge": (1, 24), "g5.4xlarge": (1, 24), "g5.8xlarge": (1, 24),
    "g5.12xlarge": (4, 24), "g5.48xlarge": (8, 24),
    "g6.2xlarge": (1, 24), "g6.4xlarge": (1, 24), "g6.12xlarge": (4, 24),
    "g6e.xlarge": (1, 48), "g6e.2xlarge": (1, 48), "g6e.4xlarge": (1, 48), "g6e.12xlarge": (4, 48),
    "p4d.24xlarge": (8, 40), "p4de.24xlarge": (8, 80), "p5.48xlarge": (8, 80),
}
SEVEN_B_BF16_GB = 15  # weights alone; the KV cache comes on top


@pytest.fixture(scope="module")
def launcher() -> dict:
    return yaml.safe_load(LAUNCHER.read_text())


@pytest.fixture(scope="module")
def ray_schema() -> dict:
    import ray

    path = os.path.join(os.path.dirname(ray.__file__), "autoscaler", "ray-schema.json")
    with open(path) as f:
        return json.load(f)


def schema_errors(config: dict, schema: dict) -> list[str]:
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<top>'}: {e.message}" for e in validator.iter_errors(config)]


def test_launcher_config_matches_rays_schema(launcher, ray_schema):
    import jsonschema

    jsonschema.validators.validator_for(ray_schema).check_schema(ray_schema)
    assert not schema_errors(launcher, ray_schema)
    assert launcher["provider"] == {**launcher["provider"], "type": "aws", "region": "us-west-2"}
    assert launcher["auth"]["ssh_user"] == "ubuntu"


def test_the_schema_check_is_not_vacuous(launcher, ray_schema):
    """Keys the launcher would reject are caught: an unknown top-level key, a fractional GPU count
    (the launcher's resources are integers) and a node type without node_config."""
    bad = copy.deepcopy(launcher)
    bad["worker_nodes"] = {}
    bad["available_node_types"]["gpu-l40s"]["resources"]["GPU"] = 0.5
    del bad["available_node_types"]["head-cpu"]["node_config"]
    errors = "\n".join(schema_errors(bad, ray_schema))
    assert "worker_nodes" in errors and "0.5" in errors and "node_config" in errors


def test_launcher_config_passes_ray_ups_own_checks(launcher):
    """What `ray up` does before touching AWS: merge the provider's defaults, then validate."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(launcher))
    validate_config(prepared)
    assert prepared["head_node_type"] == "head-cpu"


def test_gpu_workers_hold_a_7b_model_and_the_head_none(launcher):
    node_types = launcher["available_node_types"]
    head = node_types[launcher["head_node_type"]]
    assert head["node_config"]["InstanceType"] not in GPU_INSTANCES and not head["resources"].get("GPU")

    gpu_types = {name: t for name, t in node_types.items() if t["resources"].get("GPU")}
    assert gpu_types, "no worker type asks for GPUs"
    for name, node_type in gpu_types.items():
        instance = node_type["node_config"]["InstanceType"]
        assert instance in GPU_INSTANCES, f"{name}: {instance} is not a known GPU instance"
        gpus, gb = GPU_INSTANCES[instance]
        assert node_type["resources"]["GPU"] == gpus, f"{name}: resources.GPU must match {instance}'s {gpus} GPUs"
        assert gb > SEVEN_B_BF16_GB, f"{name}: {gb} GB leaves no room for a 7B model's KV cache"
        assert 0 <= node_type.get("min_workers", 0) <= node_type["max_workers"] <= launcher["max_workers"]
        assert node_type["max_workers"] >= 1


def test_setup_installs_a_cuda_torch_then_raydec_from_the_mounted_repo(launcher):
    import ray

    commands = launcher["setup_commands"]
    torch_at = [i for i, c in enumerate(commands)
                if re.search(r"pip install .*\btorch\b.*--index-url https://download\.pytorch\.org/whl/cu\d+", c)]
    raydec_at = [i for i, c in enumerate(commands) if re.search(r"pip install (-e )?~/raydec\b", c)]
    assert torch_at and raydec_at, commands
    assert torch_at[0] < raydec_at[0], "torch must come first, or raydec's `torch` requirement pulls another build"

    mounts = launcher["file_mounts"]
    assert mounts.get("~/raydec") == ".", "the repo (the folder `ray up` runs in) is mounted at ~/raydec"
    assert (ROOT / "pyproject.toml").is_file() and (ROOT / "jobs" / "t2i_batch.py").is_file()
    assert ".gitignore" in launcher["rsync_filter"]  # .venv and outputs stay behind

    pinned = [c for c in commands if re.search(r"pip install .*\bray\[", c)]
    assert pinned and f"=={ray.__version__}" in pinned[0], "the cluster's Ray must match the client's"


def test_start_commands_start_a_head_and_join_workers_to_it(launcher):
    head, workers = launcher["head_start_ray_commands"], launcher["worker_start_ray_commands"]
    assert head[0] == "ray stop" and workers[0] == "ray stop"
    start_head = " ".join(head[1].split())
    assert "ray start --head --port=6379" in start_head and "--dashboard-host=0.0.0.0" in start_head
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in start_head
    assert "ray start --address=$RAY_HEAD_IP:6379" in workers[1]
