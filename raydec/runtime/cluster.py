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


CONNECT_TIMEOUT_ENV = "RAYDEC_CONNECT_TIMEOUT_S"
"""Seconds to wait for the cluster in RAY_ADDRESS to answer (default 60)."""


class ClusterUnreachableError(RuntimeError):
    """The Ray cluster named by RAY_ADDRESS does not answer."""


def check_reachable(address: str, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for a TCP connection to the host and port of a Ray address
    (``host:port``, ``ray://host:port`` or ``http(s)://host:port``); "auto" and "local" pass.
    Ray's own ``init`` retries an unreachable address for many minutes; this fails first, clearly."""
    import socket
    import time
    from urllib.parse import urlparse

    if address in ("auto", "local") or not address:
        return
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80 if parsed.scheme == "http" else 6379)
    if not host:
        raise ClusterUnreachableError(f"RAY_ADDRESS={address!r} names no host (use host:port, ray://host:10001 or http://host:8265)")
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, max(0.1, deadline - time.monotonic()))):
                return
        except OSError as error:
            last = error
        if time.monotonic() >= deadline:
            raise ClusterUnreachableError(
                f"cannot reach the Ray cluster at RAY_ADDRESS={address!r} ({host}:{port}) after {timeout_s:.0f} s: {last}; "
                f"is it running, and is the address right? ({CONNECT_TIMEOUT_ENV} sets the wait)"
            )
        time.sleep(1.0)


def connect_ray(timeout_s: Optional[float] = None) -> None:
    """Join the cluster this process belongs to (RAY_ADDRESS / job submit), else start a local one.
    An address that does not answer within ``timeout_s`` (RAYDEC_CONNECT_TIMEOUT_S, default 60 s)
    raises ClusterUnreachableError."""
    import ray

    with _INIT_LOCK:
        if ray.is_initialized():
            return
        address = os.environ.get("RAY_ADDRESS")
        if address and address.lower().startswith(("http://", "https://")):
            raise ClusterUnreachableError(
                f"RAY_ADDRESS={address!r} is a dashboard's address, which takes jobs, not drivers: `raydec run` and `raydec "
                f"serve` submit themselves there as jobs; to drive the cluster from here, use its host:6379 or ray://host:10001")
        if address:
            wait = timeout_s if timeout_s is not None else float(os.environ.get(CONNECT_TIMEOUT_ENV, "60"))
            check_reachable(address, wait)
            ray.init(address=address)
            logger.info("connected to Ray at %s", address)
            return
    init_local_ray()
