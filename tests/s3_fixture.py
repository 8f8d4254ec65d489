"""A real S3 endpoint for tests: moto's server on 127.0.0.1, started once per session.

No in-process mocking: boto3 and pyarrow talk HTTP to the server like they would to S3.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from typing import Dict, Iterator, Optional

import pytest

from raydec.io.config import S3Config

logger = logging.getLogger(__name__)

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
STARTUP_TIMEOUT_S = 30.0
MOTO_LOG = os.path.join(tempfile.mkdtemp(prefix="raydec-moto-"), "requests.log")


def moto_requests(method: str, path_prefix: str) -> list[str]:
    """The paths of the requests with ``method`` whose path starts with ``path_prefix`` (``/bucket/key``)
    that the session's moto server has answered so far, from its request log."""
    pattern = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (\S+) HTTP/')
    paths = []
    with open(MOTO_LOG, errors="replace") as log:
        for line in log:
            found = pattern.search(line)
            if found and found.group(1) == method and found.group(2).split("?", 1)[0].startswith(path_prefix):
                paths.append(found.group(2).split("?", 1)[0])
    return paths


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _moto_server_executable() -> str:
    candidate = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.path.exists(candidate):
        pytest.fail(f"moto_server not found next to {sys.executable}: `make test` installs moto[server]")
    return candidate


def _wait_until_up(endpoint: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited early with code {process.returncode}")
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=1):
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer at {endpoint} within {STARTUP_TIMEOUT_S:.0f}s")


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Start `moto_server -H 127.0.0.1 -p PORT`, set dummy AWS credentials; yields the endpoint URL."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    saved: Dict[str, Optional[str]] = {k: os.environ.get(k) for k in DUMMY_CREDENTIALS}
    os.environ.update(DUMMY_CREDENTIALS)
    log = open(MOTO_LOG, "w")  # one line per request: tests count the GETs a download makes (moto_requests)
    process = subprocess.Popen(
        [_moto_server_executable(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=log,
    )
    try:
        _wait_until_up(endpoint, process)
        logger.info("moto_server up at %s (pid %d)", endpoint, process.pid)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture()
def s3_config(moto_server: str) -> S3Config:
    """An S3Config pointing at the moto server, with explicit dummy credentials."""
    return S3Config(
        endpoint_url=moto_server,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
    )


@pytest.fixture()
def s3_bucket(s3_config: S3Config) -> str:
    """A fresh, empty bucket on the moto server; yields its name."""
    from raydec.io.filesystem import s3_client

    name = f"test-{uuid.uuid4().hex[:12]}"
    s3_client(s3_config).create_bucket(Bucket=name)
    return name


def upload_folder(s3: S3Config, bucket: str, prefix: str, folder: "os.PathLike[str] | str") -> list[str]:
    """Put every file under ``folder`` at ``s3://bucket/prefix/<relative path>``; returns the keys."""
    from pathlib import Path

    from raydec.io.filesystem import s3_client

    client, keys = s3_client(s3), []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            key = f"{prefix.strip('/')}/{path.relative_to(folder).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            keys.append(key)
    return keys
