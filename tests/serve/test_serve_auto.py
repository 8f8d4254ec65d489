"""``auto`` batch size and draft shape in Serve: a replica settles both when it starts, from the
shape cache (the key a job uses) or by tuning on calibration rows it makes itself, and says what it
decodes with in its stats."""

from __future__ import annotations

import asyncio

import logging

import numpy as np
import pytest

from tests.serve.conftest import SEEDED_SHAPE
from tests.serve.helpers import pixels, stats


def test_a_replica_takes_its_auto_batch_size_and_shape_from_the_shape_cache(client, serve_app):
    """'t2i-auto' leaves both to auto; the cache seeded before the app started knows batch 2 only."""
    from raydec.api import generate_images
    from raydec.api.draft_shapes import apply_shape
    from raydec.config import DecodeConfig

    now = stats(serve_app, "t2i-auto")
    assert (now["method"], now["shape"], now["batch_size"]) == ("sjd_pac", SEEDED_SHAPE["label"], 2)
    assert (now["plan"]["shape_from"], now["plan"]["batch_from"]) == ("cache", "measured")
    batch = now["plan"]["batch"]
    assert batch["best_batch"] == 2 and batch["batch_size"] == 2 and batch["kv_bytes_per_row"] > 0 and batch["max_memory_fraction"] == 0.9
    response = client.images.generate(prompt="a red circle", model="t2i-auto", response_format="b64_json", extra_body={"seed": 5})
    (expected,) = generate_images(["a red circle"], model=str(serve_app["janus"]), seeds=[5],
                                  decode=apply_shape(DecodeConfig(method="sjd_pac"), SEEDED_SHAPE))
    assert np.array_equal(pixels(response.data[0].b64_json), np.asarray(expected.image))
    fixed = stats(serve_app, "t2i")  # a model whose config names its shape
    assert (fixed["method"], fixed["shape"], fixed["batch_size"]) == ("sjd_pac", "window=16,init=uniform", 8)
    assert (fixed["plan"]["shape_from"], fixed["plan"]["batch_from"]) == ("default", "config")


@pytest.mark.parametrize("task", ["t2i", "caption"])
def test_a_replica_tunes_its_auto_shape_at_start_and_caches_it_for_the_next(serve_app, tmp_path, monkeypatch, caplog, task):
    """The replica class in this process (ray is up: its metrics need it), on an empty shape cache:
    SJD-PAC's window on the tiny Janus, ViSpec's draft tree on the reference VLM (short captions)."""
    from raydec.serve.config import LimitsConfig, ServedModel
    from raydec.serve.replica import ChatReplica, ImageReplica

    monkeypatch.setenv("RAYDEC_CACHE_DIR", str(tmp_path))
    if task == "t2i":
        replica = ImageReplica
        served = ServedModel(name="tuned", task="t2i", model=str(serve_app["janus"]), decode={"method": "sjd_pac", "jacobi": "auto"},
                             batch_size=2)
    else:
        replica = ChatReplica
        served = ServedModel(name="tuned", task="caption", decode={"method": "vispec", "max_new_tokens": 16, "draft_tree": "auto"},
                             batch_size=2)
    with caplog.at_level(logging.INFO, logger="raydec.serve"):
        first = replica(served, LimitsConfig())
    try:
        decoding = asyncio.run(first.decoding())
        assert decoding["plan"]["shape_from"] == "tuned" and decoding["batch_size"] == 2
        assert [path.name for path in (tmp_path / "shapes").glob("*.json")]  # written for the next replica
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model tuned ")]
        shown = "ar" if decoding["method"] == "ar" else f"{decoding['method']} {decoding['shape']}"  # the tuner may choose AR
        assert f"batch_size 2, {shown} (auto: tuned in" in line
        second = replica(served, LimitsConfig())
        try:
            again = asyncio.run(second.decoding())
            assert again["plan"]["shape_from"] == "cache" and (again["method"], again["shape"]) == (decoding["method"], decoding["shape"])
        finally:
            second.engine.stop()
    finally:
        first.engine.stop()
