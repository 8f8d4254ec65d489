"""``build_processor``: text-to-image and captioning as Dataset -> Dataset stages in a user's own
Ray Data pipeline (a map before, a filter after), validation in the workers, outputs equal to
the public functions for the same seeds."""

from __future__ import annotations

import io

import numpy as np
import torch
import pytest
from PIL import Image

from tests.ray_fixture import ray_cluster  # noqa: F401


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_t2i_stage_composes_with_a_users_map_and_filter(ray_cluster, tmp_path):
    import ray.data

    from raydec.api import generate_images
    from raydec.runtime import ProcessorConfig, build_processor

    rows = [{"id": f"p{i}", "text": text, "seed": 100 + i} for i, text in
            enumerate(["a red circle on the left", "", "a blue square at the top", "x " * 300])]
    sjd = {"method": "sjd", "jacobi": {"window": 16}}  # a fixed shape: the outputs are compared with generate_images'
    processor = build_processor(ProcessorConfig(task="t2i", model="reference", decode=sjd, batch_size=2,
                                                concurrency=(1, 2), rows={"prompt_column": "prompt"}))
    dataset = ray.data.from_items(rows).map(lambda row: {**row, "prompt": row["text"].strip()})  # the user's map
    out = processor(dataset).materialize()  # decoded once; the user's filter below runs on it
    everything = sorted(out.take_all(), key=lambda row: row["id"])
    assert [row["id"] for row in everything] == ["p0", "p1", "p2", "p3"]
    assert everything[0]["text"] == "a red circle on the left"  # input columns are kept
    assert "prompt: empty" in everything[1]["error"] and everything[1]["image"] is None
    assert "max_prompt_words" in everything[3]["error"]
    good = sorted(out.filter(lambda row: row["error"] is None).take_all(), key=lambda row: row["id"])  # the user's filter
    assert [row["id"] for row in good] == ["p0", "p2"]
    expected = generate_images([good[0]["prompt"], good[1]["prompt"]], decode=sjd, seeds=[100, 102])
    for row, result in zip(good, expected):
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(row["image"])).convert("RGB")), np.asarray(result.image))
        assert row["target_forwards"] == result.target_forwards and row["tokens"] == 256 and row["method"] == "sjd"

    written = build_processor(ProcessorConfig(task="t2i", model="reference", decode={"method": "ar"}, batch_size=2, rows={"prompt_column": "text"},
                                              images_to={"path": str(tmp_path / "pngs")}))
    row = written(ray.data.from_items(rows[:1])).take_all()[0]
    assert row["image_uri"].endswith(".png") and Image.open(row["image_uri"]).size == (64, 64)
    assert "image" not in row


def test_caption_stage_validates_images_in_the_workers(ray_cluster):
    import ray.data

    from raydec.api import caption_images
    from raydec.reference.shapes import sample_images
    from raydec.runtime import build_processor

    image = sample_images([11])[0]
    bomb = bytearray(_png(Image.new("RGB", (8, 8))))  # its header patched to declare 20000 x 20000
    import struct
    import zlib

    bomb[16:24] = struct.pack(">II", 20000, 20000)
    bomb[29:33] = struct.pack(">I", zlib.crc32(bytes(bomb[12:29])))
    rows = [{"id": "ok", "image": _png(image), "seed": 5}, {"id": "corrupt", "image": b"not an image", "seed": 6},
            {"id": "bomb", "image": bytes(bomb), "seed": 7}, {"id": "missing", "image": None, "seed": 8}]
    vispec = {"method": "vispec"}  # the default tree
    processor = build_processor({"task": "caption", "model": "reference", "decode": vispec, "batch_size": 4})
    out = {row["id"]: row for row in processor(ray.data.from_items(rows)).take_all()}
    assert out["ok"]["error"] is None
    assert out["ok"]["caption"] == caption_images([image], decode=vispec, seeds=[5])[0].caption
    assert "corrupt" in out["corrupt"]["error"]
    assert "max_image_pixels" in out["bomb"]["error"] and "20000x20000" in out["bomb"]["error"]
    assert "missing" in out["missing"]["error"]


def test_processor_config_errors_name_the_field():
    from pydantic import ValidationError

    from raydec.runtime import ProcessorConfig

    for raw, needle in [({"task": "t2i", "model": "reference", "decode": {"method": "vispec"}}, "decode.method"),
                        ({"task": "t2i", "model": "reference", "concurrency": (3, 1)}, "concurrency"),
                        ({"task": "caption", "model": "reference", "decode": {"method": "ar"}, "images_to": {"path": "/tmp/x"}}, "images_to"),
                        ({"task": "t2i", "model": "reference", "rows": {"prompt_colum": "p"}}, "prompt_colum")]:
        with pytest.raises(ValidationError, match=needle):
            ProcessorConfig.model_validate(raw)


def test_an_actor_runs_torch_on_the_cpus_ray_reserves_for_it():
    from raydec.runtime import ProcessorConfig

    def threads(**pool) -> int:
        return ProcessorConfig(task="t2i", model="reference", **pool).threads

    assert threads() == 1 and threads(cpus_per_worker=0.5) == 1  # a fraction of a CPU: one thread
    assert threads(cpus_per_worker=4) == 4 and threads(cpus_per_worker=2.5) == 2
    assert threads(cpus_per_worker=4, torch_threads=2) == 2  # set: it wins


def test_an_auto_batch_size_and_shape_are_chosen_once_for_every_actor_of_the_stage(ray_cluster, tmp_path, monkeypatch):
    import ray.data

    from raydec.api import generate_images, load_target
    from raydec.runtime import ProcessorConfig, build_processor
    from tests.t2i_toys import tiny_janus

    monkeypatch.setenv("RAYDEC_CACHE_DIR", str(tmp_path / "cache"))
    model = str(tiny_janus(tmp_path / "janus"))  # 16 image tokens: tuning takes seconds
    rows = [{"id": f"p{i}", "prompt": text, "seed": 10 + i} for i, text in
            enumerate(["a red circle", "a blue square", "a green triangle", "a purple cross", "two red circles"])]
    processor = build_processor(ProcessorConfig(task="t2i", model=model, dtype="float64", decode={"method": "sjd_pac", "jacobi": "auto"},
                                                batch_size="auto", concurrency=2))
    assert processor.config.decode.jacobi == "auto"
    out = sorted(processor(ray.data.from_items(rows)).take_all(), key=lambda row: row["id"])
    chosen = processor.config.decode  # what every actor decoded with
    assert not chosen.auto_shape and list((tmp_path / "cache" / "shapes").glob("*.json"))
    assert 1 <= processor.config.batch_size <= 256  # the batch the memory holds, chosen before the shape (tuned for it)
    expected = generate_images([r["prompt"] for r in rows], model=load_target(model, dtype=torch.float64), decode=chosen,
                               seeds=[r["seed"] for r in rows])
    for row, result in zip(out, expected):
        assert row["error"] is None and row["method"] == chosen.method
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(row["image"])).convert("RGB")), np.asarray(result.image))
