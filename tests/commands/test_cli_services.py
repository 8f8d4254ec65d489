"""`raydec serve` as a user runs it: until SIGTERM, answering meanwhile. (`raydec train` on a tiny
VLM: tests/runtime/test_train_vispec.py, beside the data it reuses.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from tests.ray_fixture import _free_ports

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
ENV.pop("RAY_ADDRESS", None)


def test_raydec_serve_serves_until_sigterm(tmp_path):
    (port,) = _free_ports(1)
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"port": port, "api_keys_env": None,
                                      "models": [{"name": "t2i", "task": "t2i", "decode": {"method": "ar"}}]}))
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "raydec.cli", "serve", "--config", str(config)], stdout=log,
                               stderr=subprocess.STDOUT, env=ENV, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while "raydec: serving at" not in (tmp_path / "serve.log").read_text():
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["t2i"]
        body = json.dumps({"prompt": "a red circle", "model": "t2i", "seed": 1}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/images/generations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert json.load(response)["data"][0]["b64_json"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        log.close()
