"""The long-running commands on tiny inputs, as a user runs them: `raydec serve` until SIGTERM,
and `raydec train` on a tiny VLM."""

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


def test_raydec_train_trains_a_draft_for_a_tiny_vlm(tmp_path):
    from tests.vlm_toys import build_tiny_llava

    target = build_tiny_llava(tmp_path / "tiny_llava")
    config = tmp_path / "draft.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"target": str(target), "output_dir": str(tmp_path / "data"), "num_samples": 4, "max_new_tokens": 8,
                 "batch_size": 2, "workers": 1, "cpus_per_worker": 0.5, "storage_dtype": "float32"},
        "drafts": [{"name": "eagle", "vision": False, "output_dir": str(tmp_path / "eagle"), "steps": 2, "batch_size": 2,
                    "warmup_steps": 0, "num_workers": 1, "cpus_per_worker": 0.5, "log_every": 1}],
    }))
    done = subprocess.run([sys.executable, "-m", "raydec.cli", "train", "--config", str(config)], capture_output=True, text=True,
                          timeout=300, env=ENV, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "eagle" / "draft_config.json").is_file()
    assert list((tmp_path / "eagle").glob("*.safetensors"))
