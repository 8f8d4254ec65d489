"""`raydec serve` run as a user runs it, in a subprocess: a one-model config (plain AR on the
reference Janus) on a free port, checked through HTTP until a signal stops it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from tests.ray_fixture import _free_ports


def write_serve_config(folder: Path) -> tuple[Path, int]:
    """serve.yaml in ``folder`` (one t2i model, AR, no keys) on a free port: (its path, the port)."""
    (port,) = _free_ports(1)
    path = folder / "serve.yaml"
    path.write_text(yaml.safe_dump({"port": port, "api_keys_env": None,
                                    "models": [{"name": "t2i", "task": "t2i", "decode": {"method": "ar"}}]}))
    return path, port


def serve_until_stopped(config: Path, port: int, env: dict, log_path: Path, stop: signal.Signals = signal.SIGTERM,
                        ready_s: float = 300, exits: tuple[int, ...] = (0,)) -> str:
    """Start `raydec serve --config config` in its folder, wait for "raydec: serving at", check that
    /v1/models lists "t2i" and an image request answers, send ``stop`` and check the exit status is
    one of ``exits``, and that the model's replica and engine processes are gone. Returns what it printed;
    the process is killed whatever happens."""
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "raydec.cli", "serve", "--config", config.name], stdout=log,
                                   stderr=subprocess.STDOUT, env=env, cwd=config.parent)
        try:
            deadline = time.monotonic() + ready_s
            while "raydec: serving at" not in log_path.read_text():
                assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.5)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
                assert [m["id"] for m in json.load(response)["data"]] == ["t2i"]
            body = json.dumps({"prompt": "a red circle", "model": "t2i", "seed": 1}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/images/generations", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                assert json.load(response)["data"][0]["b64_json"]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/raydec/stats", timeout=30) as response:
                served = json.load(response)["t2i"]
            process.send_signal(stop)
            assert process.wait(timeout=90) in exits, log_path.read_text()[-3000:]
            deadline = time.monotonic() + 30
            while any(map(running, (served["pid"], served["engine_pid"]))):  # the replica and its engine process end with the app
                assert time.monotonic() < deadline, f"left running: replica {served['pid']}, engine {served['engine_pid']}"
                time.sleep(0.2)
        finally:
            if process.poll() is None:
                process.kill()
    return log_path.read_text()


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
