"""`raydec serve` as a user runs it: until SIGTERM, answering meanwhile. (`raydec train` on a tiny
VLM: tests/runtime/test_train_vispec.py, beside the data it reuses.)"""

from __future__ import annotations

import os
from pathlib import Path


from tests.serve_process import serve_until_stopped, write_serve_config

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
ENV.pop("RAY_ADDRESS", None)


def test_raydec_serve_serves_until_sigterm(tmp_path):
    config, port = write_serve_config(tmp_path)
    serve_until_stopped(config, port, ENV, tmp_path / "serve.log", ready_s=240)
