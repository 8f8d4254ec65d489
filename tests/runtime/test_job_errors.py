"""What a user trial of the batch jobs hit, each answered in one line: an unreachable cluster
address, a duplicate id; and where results go is logged absolute."""

from __future__ import annotations

import logging
import re
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


def test_an_unsupported_family_or_method_fails_before_ray_in_one_line(tmp_path):
    """A checkpoint of a family the task does not take, or a method of the other task: one line
    naming it (after the config's name), from the job and train commands alike; Ray never starts."""
    import json

    import ray
    import yaml

    from raydec.commands.train import main as train_main
    from raydec.runtime.entrypoint import job_main

    ray.shutdown()  # an earlier test of this module may have started it: these checks must not

    def checkpoint(model_type: str):
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        return str(folder)

    prompts = tmp_path / "prompts.parquet"
    pq.write_table(pa.table({"id": ["a"], "prompt": ["a red circle"], "image_uri": [str(tmp_path / "x.png")]}), prompts)
    jobs = {
        "qwen2_vl t2i": ({"task": "t2i", "model": checkpoint("qwen2_vl")}, r"'qwen2_vl' checkpoint; text-to-image supports"),
        "janus caption": ({"task": "caption", "model": checkpoint("janus")}, r"'janus' checkpoint; captioning supports"),
        "vispec t2i": ({"task": "t2i", "model": "reference", "decode": {"method": "vispec"}},
                       r"decode\.method: 'vispec' is not a text-to-image method \(use ar, sjd, sjd_ac, sjd_pac\)"),
    }
    for name, (values, message) in jobs.items():
        config = tmp_path / f"{name.replace(' ', '_')}.yaml"
        config.write_text(yaml.safe_dump({"input": {"path": str(prompts)}, "output": {"path": str(tmp_path / "out")}, **values}))
        with pytest.raises(SystemExit) as exited:
            job_main(values["task"], "test", ["--config", str(config)])
        problems = str(exited.value).splitlines()[-1]  # a config file's refusal: its name, then one line per problem
        assert re.search(message, problems) and len(str(exited.value).splitlines()) <= 2, (name, str(exited.value))
    train = tmp_path / "train.yaml"
    train.write_text(yaml.safe_dump({"data": {"target": checkpoint("mllama"), "output_dir": str(tmp_path / "data")}}))
    with pytest.raises(SystemExit) as exited:
        train_main(["--config", str(train)])
    assert re.search(r"data\.target: .* is a 'mllama' checkpoint; drafts train for", str(exited.value)), str(exited.value)
    assert not ray.is_initialized() and not (tmp_path / "out").exists() and not (tmp_path / "data").exists()


def test_a_jobs_image_size_reaches_its_stage_and_a_size_the_model_cannot_make_fails_before_ray(tmp_path):
    """`size` in a text-to-image job: checked against the checkpoint's config before Ray starts
    (naming the sizes the model makes), handed to the stage, part of the resume identity; a
    captioning job has none."""
    import ray
    from pydantic import ValidationError

    from raydec.runtime import JobConfig, preflight
    from raydec.runtime.resume import _resume_identity
    from tests.t2i_toys import tiny_emu3

    ray.shutdown()  # an earlier test of this module may have started it: these checks must not

    emu3 = str(tiny_emu3(tmp_path / "emu3", seed=0))
    prompts = tmp_path / "prompts.parquet"
    pq.write_table(pa.table({"id": ["a"], "prompt": ["a red circle"]}), prompts)
    base = {"task": "t2i", "model": emu3, "input": {"path": str(prompts)}, "output": {"path": str(tmp_path / "out")}}
    job = JobConfig.model_validate({**base, "size": "16x24"})
    preflight(job)
    assert job.processor_config().size == "16x24"
    assert _resume_identity(job.model_dump(mode="json"))["size"] == "16x24"
    assert _resume_identity({**job.model_dump(mode="json"), "size": "auto"})["size"] is None
    with pytest.raises(ValueError, match=r"size: '20x20' is not a size this Emu3 makes: widths and heights in multiples of 8"):
        preflight(JobConfig.model_validate({**base, "size": "20x20"}))
    with pytest.raises(ValueError, match=r"size: '16x16' is not a size this Janus makes: 64x64 only"):
        preflight(JobConfig.model_validate({**base, "model": "reference", "size": "16x16"}))
    with pytest.raises(ValidationError, match="String should match pattern"):
        JobConfig.model_validate({**base, "size": "large"})
    with pytest.raises(ValidationError, match="only text-to-image makes images"):
        JobConfig.model_validate({**base, "task": "caption", "model": "reference", "size": "16x24"})
    assert not ray.is_initialized()
