"""A private Ray cluster on 127.0.0.1 for runtime tests, shared by the modules that ask for it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

_SHARED: dict = {}
"""The cluster `ray_cluster` started and left up: {"gcs": its GCS address, "env_vars": its workers' env_vars}."""


def _worker_env_vars() -> dict:
    """PYTHONPATH (this checkout first) and whichever AWS credentials are set now (moto's, once it runs)."""
    env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        if os.environ.get(name):
            env_vars[name] = os.environ[name]
    return env_vars


def _shared_cluster_is_up() -> bool:
    import ray

    return bool(_SHARED) and ray.is_initialized() and ray.get_runtime_context().gcs_address == _SHARED["gcs"]


def stop_shared_cluster() -> None:
    """Shut down the cluster `ray_cluster` left up, if it is still this process's Ray."""
    if not _SHARED:
        return
    import ray

    if _shared_cluster_is_up():
        ray.shutdown()
    _SHARED.clear()


@pytest.fixture(scope="session")
def _ray_session() -> Iterator[None]:
    yield
    stop_shared_cluster()


@pytest.fixture(scope="module")
def ray_cluster(_ray_session) -> Iterator[None]:
    """`ray.init(address="local", num_cpus=2)` on loopback, no dashboard, its workers given
    `_worker_env_vars()`. Started fresh unless the cluster an earlier module used is still up with
    the same env_vars; it is stopped before the first test of a module that does not ask for it
    (`pytest_runtest_setup` in tests/conftest.py), and at the session's end."""
    import ray

    from raydec.runtime.cluster import init_local_ray

    env_vars = _worker_env_vars()
    if _shared_cluster_is_up() and _SHARED["env_vars"] == env_vars:
        yield
        return
    if ray.is_initialized():
        ray.shutdown()
    _SHARED.clear()
    init_local_ray(num_cpus=2, env_vars=env_vars, object_store_memory=200 * 2**20)
    _SHARED.update(gcs=ray.get_runtime_context().gcs_address, env_vars=env_vars)
    yield


def actor_pids(title: str) -> list:
    """PIDs of the worker processes of this driver's Ray cluster whose title contains ``title``.

    Ray titles an actor's process ``ray::<class name>...`` (Ray Data's pool:
    ``ray::MapWorker(MapBatches(GenerationWorker))``). Only children of this cluster's raylets count:
    ``ray.nodes()`` names each raylet's socket, a path under the cluster's own session folder, so
    another cluster's workers on the machine (another test run's) are never matched.
    """
    import ray

    sockets = [node["RayletSocketName"] for node in ray.nodes() if node.get("Alive")]
    processes = _process_table()
    raylets = {pid for pid, (_, cmdline) in processes.items()
               if "raylet" in cmdline.split(" ", 1)[0] and any(f"--raylet_socket_name={s} " in cmdline + " " for s in sockets)}
    return sorted(pid for pid, (parent, cmdline) in processes.items()
                  if parent in raylets and cmdline.startswith("ray::") and title in cmdline)


# ----------------------------------------------------------------------------- ray start --head


def _free_ports(count: int) -> list:
    """`count` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    import socket

    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _process_table() -> dict:
    """pid -> (parent pid, command line) of every process this machine's /proc shows."""
    processes = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        processes[int(entry)] = (parent, cmdline)
    return processes


def _processes_under(marker: str) -> list:
    """PIDs whose command line mentions `marker` (our private temp dir), plus their descendants."""
    processes = _process_table()
    parents = {pid: parent for pid, (parent, _) in processes.items()}
    found = {pid for pid, (_, cmdline) in processes.items() if marker in cmdline}
    changed = True
    while changed:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        changed = bool(children)
        found |= children
    return sorted(found - {os.getpid()})


def stop_own_cluster(temp_dir: str, grace_s: float = 3.0) -> None:
    """Stop the cluster whose processes use `temp_dir`, by PID: TERM, then KILL after `grace_s`.

    Not `ray stop`: that stops every Ray cluster on the machine, other people's included.
    The cluster's `ray_current_cluster` file lives in `temp_dir`, so nothing is left behind.
    """
    import signal
    import time

    pids = _processes_under(temp_dir)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
        time.sleep(0.2)
    for pid in _processes_under(temp_dir) + pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def ray_head() -> Iterator[dict]:
    """`ray start --head` with the dashboard, all on 127.0.0.1 with free ports and a private temp dir.

    Yields {"address": dashboard URL, "gcs": host:port, "env": environment
    for `ray job submit`}.
    """
    import sys

    bin_dir = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(bin_dir, "ray")):
        pytest.fail(f"no ray CLI next to {sys.executable}: `make test` installs ray[data,serve,train]")
    with own_ray_head(bin_dir) as head:
        yield head


@contextlib.contextmanager
def own_ray_head(bin_dir: str) -> Iterator[dict]:
    """``ray start --head`` run by the python in ``bin_dir`` (its cluster's python: its jobs run
    ``python`` from there), as ``ray_head`` describes."""
    import shutil
    import subprocess
    import tempfile
    import time
    import urllib.request

    ray_cli = [os.path.join(bin_dir, "python"), "-c", "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"]
    temp_dir = tempfile.mkdtemp(prefix="rdj", dir="/tmp")  # short: Unix socket paths live under it
    gcs, dashboard, agent_http, agent_grpc, metrics, runtime_env, client = _free_ports(7)
    env = dict(os.environ)
    env.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
        PATH=bin_dir + os.pathsep + env.get("PATH", ""),
    )
    env.pop("RAY_ADDRESS", None)
    command = [
        *ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=2",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
        f"--ray-client-server-port={client}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
    ]
    address = f"http://127.0.0.1:{dashboard}"
    try:
        subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
        deadline = time.monotonic() + 90
        while True:  # the job agent registers a little after `ray start` returns
            try:
                with urllib.request.urlopen(f"{address}/api/jobs/", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Ray dashboard at {address} did not come up")
                time.sleep(1)
        env["RAY_ADDRESS"] = address
        yield {"address": address, "gcs": f"127.0.0.1:{gcs}", "env": env, "temp_dir": temp_dir}
    finally:
        stop_own_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
