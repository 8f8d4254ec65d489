"""What a user trial of the batch jobs hit, each answered in one line: an unreachable cluster
address, a duplicate id; and where results go is logged absolute."""

from __future__ import annotations

import logging
import socket
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_cluster_address_fails_fast_and_says_so(monkeypatch):
    import ray

    from raydec.runtime.cluster import ClusterUnreachableError, connect_ray

    assert not ray.is_initialized()
    port = _closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(ClusterUnreachableError, match=rf"RAY_ADDRESS='127.0.0.1:{port}'.* after 2 s.*RAYDEC_CONNECT_TIMEOUT_S"):
        connect_ray(timeout_s=2)
    assert time.monotonic() - started < 10 and not ray.is_initialized()


def test_a_duplicate_id_is_a_one_line_error(tmp_path, caplog):
    from raydec.runtime.entrypoint import job_main

    data = tmp_path / "in" / "prompts.parquet"
    data.parent.mkdir()
    pq.write_table(pa.table({"id": ["a", "b", "a"], "prompt": ["a red circle", "a blue square", "a green cross"]}), data)
    config = tmp_path / "job.yaml"
    config.write_text(f"task: t2i\nmodel: reference\ninput:\n  path: {data}\noutput:\n  path: {tmp_path / 'out'}\n")
    with caplog.at_level(logging.INFO):
        with pytest.raises(SystemExit) as stopped:
            job_main("t2i", "test", ["--config", str(config)])
    message = str(stopped.value)
    assert "\n" not in message and "id 'a' appears twice" in message and str(config) in message
    assert str(tmp_path / "out") in caplog.text  # preflight logs where the results go, absolute


def test_an_autoscaling_pool_grows_from_min_workers_and_never_past_the_batches():
    from raydec.runtime.config import JobConfig
    from raydec.runtime.pipeline import _pool_strategy

    def job(**pool):
        return JobConfig.model_validate({"task": "t2i", "model": "reference", "input": {"path": "in.parquet"},
                                         "output": {"path": "out"}, "pool": {"batch_size": 8, **pool}})

    fixed = _pool_strategy(job(workers=4), rows=100)
    assert (fixed.min_size, fixed.max_size) == (4, 4)
    scaling = _pool_strategy(job(workers=4, min_workers=1), rows=100)
    assert (scaling.min_size, scaling.max_size) == (1, 4)
    small = _pool_strategy(job(workers=4, min_workers=2), rows=8)  # one batch: one actor
    assert (small.min_size, small.max_size) == (1, 1)
