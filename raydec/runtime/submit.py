"""A ``raydec`` command run on a cluster through its dashboard: a Ray job, as ``ray job submit`` makes one.

    RAY_ADDRESS=http://head:8265 raydec run job.yaml     # -> the job `raydec run job.yaml`, its logs here

The three address forms a user has for a cluster:

- ``host:port`` (the GCS, 6379 by default) and ``ray://host:10001`` (Ray Client): this process
  joins the cluster (``raydec.runtime.cluster.connect_ray``) and drives it;
- ``http(s)://host:8265`` (the dashboard): the dashboard takes jobs, not drivers, so the command
  itself is submitted as a job: its working directory is a copy of this folder (uploaded, files
  that .gitignore names left out, as ``ray job submit --working-dir .`` does), its runtime env
  carries raydec's own settings (``RAYDEC_*``), and this process prints the job's logs until it
  ends and exits with its status. Ctrl-C stops the job.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from pathlib import Path
from typing import Callable, Sequence

logger = logging.getLogger(__name__)

AGENT_WAIT_S = 60.0  # a head that just started registers its job agent a little later
STOP_WAIT_S = 15.0  # Ctrl-C: how long the command waits for the cluster to confirm the job's stop
FORWARDED_PREFIX = "RAYDEC_"  # environment variables a submitted command takes along (not credentials)
#: what a submitted command imports before it can say anything (raydec itself, then what its commands need)
REQUIRED_MODULES = ("raydec", "ray", "pyarrow", "pydantic", "yaml", "torch", "transformers", "safetensors", "boto3", "PIL")
CLUSTER_PYTHON_PROBLEM = "raydec: the cluster's python"
PROBE_VARIABLE = "RAYDEC_CLUSTER_CHECK"  # the job's environment carries the probe, so its command line stays short
# Runs before raydec on the cluster, in the job's working directory, with no import of raydec: a python
# that lacks it or its dependencies ends the job with one line (and exit status 1), not a traceback.
_PROBE = (
    "import importlib.util as u, sys; "
    f"missing = [m for m in {REQUIRED_MODULES!r} if u.find_spec(m) is None]; "
    f"missing and sys.exit({CLUSTER_PYTHON_PROBLEM!r} + ' (' + sys.executable + ') cannot import ' + ', '.join(missing) + "
    "': install raydec in the environment the cluster runs (pip install raydec, or the image its nodes start from), "
    "or start Ray from the environment raydec is installed in')"
)


def is_dashboard_address(address: str | None) -> bool:
    """Whether ``address`` is a dashboard's (``http(s)://``), which takes jobs rather than drivers."""
    return bool(address) and address.lower().startswith(("http://", "https://"))


def in_working_dir(path: str | Path, field: str) -> str:
    """``path`` relative to this folder, the submitted job's working directory; a ValueError naming
    ``field`` when it lies outside (the cluster has no copy of it)."""
    resolved, here = Path(path).resolve(), Path.cwd().resolve()
    try:
        return str(resolved.relative_to(here))
    except ValueError:
        raise ValueError(f"{field} {str(path)!r} is outside this folder ({here}), which a job submitted to the dashboard in "
                         f"RAY_ADDRESS runs in a copy of: run from a folder that holds it, or join the cluster with "
                         f"RAY_ADDRESS=host:6379 or ray://host:10001") from None


def submit_command(address: str, argv: Sequence[str], echo: Callable[[str], None] = print, poll_s: float = 1.0) -> int:
    """Run ``raydec ARGV`` as a Ray job on the cluster whose dashboard is ``address``; print its logs
    as they come; return 0 when it succeeded, 1 otherwise."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    entrypoint = f'python -c "${PROBE_VARIABLE}" && python -m raydec.cli ' + shlex.join(argv)
    env_vars = {name: value for name, value in os.environ.items() if name.startswith(FORWARDED_PREFIX)}
    runtime_env = {"working_dir": ".", "env_vars": {**env_vars, PROBE_VARIABLE: _PROBE}}
    job_id = _submit(client, entrypoint, runtime_env)
    echo(f"raydec: submitted `raydec {shlex.join(argv)}` to {address} as job {job_id}; its logs follow (Ctrl-C stops it)")
    shown = 0
    try:
        while True:
            status = client.get_job_status(job_id)
            logs = client.get_job_logs(job_id)
            if len(logs) > shown:
                echo(logs[shown:].rstrip("\n"))
                shown = len(logs)
            if status.is_terminal():
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return _stop(client, job_id, echo)
    problem = [line for line in client.get_job_logs(job_id).splitlines() if line.startswith(CLUSTER_PYTHON_PROBLEM)]
    if status != JobStatus.SUCCEEDED and problem:  # said once, as the last line: Ray's message would repeat the logs
        echo(f"raydec: job {job_id} failed: {problem[-1].removeprefix('raydec: ')}")
        return 1
    info = client.get_job_info(job_id)
    echo(f"raydec: job {job_id} {str(status).lower()}" + (f": {info.message}" if status != JobStatus.SUCCEEDED and info.message else ""))
    return 0 if status == JobStatus.SUCCEEDED else 1


def _stop(client, job_id: str, echo: Callable[[str], None]) -> int:
    """Ask the cluster to stop ``job_id`` (Ctrl-C), waiting at most STOP_WAIT_S for its answer: a busy
    head must not keep the command from exiting. A second Ctrl-C exits at once. Returns 130."""
    import threading

    answered = threading.Event()

    def ask() -> None:
        try:
            client.stop_job(job_id)
        except Exception as error:  # noqa: BLE001 - the command is exiting; say what the cluster answered
            logger.warning("stopping job %s: %s", job_id, error)
        answered.set()

    threading.Thread(target=ask, name="raydec-stop-job", daemon=True).start()
    try:
        answered.wait(STOP_WAIT_S)
    except KeyboardInterrupt:
        pass
    echo(f"raydec: stopped job {job_id}" if answered.is_set() else
         f"raydec: stopped job {job_id} (asked; the cluster had not answered within {STOP_WAIT_S:.0f} s: `ray job status {job_id}`)")
    return 130


def _submit(client, entrypoint: str, runtime_env: dict) -> str:
    """``client.submit_job``, retried while the head's job agent is still registering."""
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
        except RuntimeError as error:
            if "No available agent" not in str(error) or time.monotonic() > deadline:
                raise
            logger.info("the cluster's job agent is not up yet; retrying")
            time.sleep(2.0)
