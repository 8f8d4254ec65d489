"""A private Ray cluster on 127.0.0.1 for runtime tests, one per test module."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """`ray.init(address="local", num_cpus=2)` on loopback, no dashboard; shut down after the module."""
    ray = pytest.importorskip("ray")
    from raydec.runtime.cluster import init_local_ray

    if ray.is_initialized():
        ray.shutdown()
    env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        if os.environ.get(name):
            env_vars[name] = os.environ[name]
    init_local_ray(num_cpus=2, env_vars=env_vars, object_store_memory=200 * 2**20)
    try:
        yield
    finally:
        ray.shutdown()
