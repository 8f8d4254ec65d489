"""Connecting to Ray: an existing cluster (job submit, RAY_ADDRESS) or a local one on loopback."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Dict, Optional

logger = logging.getLogger(__name__)
_INIT_LOCK = threading.Lock()  # one ray.init per process, whichever thread asks first

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
"""A private local Ray 2.60 cluster: every listener on 127.0.0.1, so no token auth is needed.
Values already set in the environment win."""


def init_local_ray(
    num_cpus: Optional[int] = None, env_vars: Optional[Dict[str, str]] = None, log_to_driver: bool = True, **kwargs: Any
) -> None:
    """Start a private local Ray cluster on 127.0.0.1 (no dashboard), unless Ray is already up.
    log_to_driver: print the workers' logs here too (they are always in Ray's log files).

    Safe to call from several threads at once (e.g. a notebook's parallel jobs): one starts it.
    """
    import ray

    with _INIT_LOCK:
        if ray.is_initialized():
            return
        for name, value in LOOPBACK_ENV.items():
            os.environ.setdefault(name, value)
        runtime_env = {"env_vars": dict(env_vars)} if env_vars else None
        ray.init(
            address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
            runtime_env=runtime_env, log_to_driver=log_to_driver, **kwargs,
        )
    logger.info("started a local Ray cluster on 127.0.0.1 with %s CPU(s)", ray.cluster_resources().get("CPU"))


def connect_ray() -> None:
    """Join the cluster this process belongs to (RAY_ADDRESS / job submit), else start a local one."""
    import ray

    with _INIT_LOCK:
        if ray.is_initialized():
            return
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
            logger.info("connected to Ray at %s", os.environ["RAY_ADDRESS"])
            return
    init_local_ray()
