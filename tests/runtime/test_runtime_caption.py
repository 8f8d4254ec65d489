"""Captioning batch jobs on Ray: a tiny real LLaVA through the actor-pool pipeline.

Inline image bytes, local paths and s3:// URIs in; captions out (locally and to S3). Bad rows
(corrupt bytes, a missing file, a missing S3 object, no image at all) get an ``error`` and
the job goes on. Greedy ViSpec through the pool writes AR's captions, row for row.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Dict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raydec.io import OutputConfig, ResultWriter, error_result, read_manifest, read_results, write_manifest
from raydec.io.filesystem import s3_client
from raydec.reference.shapes import make_sample, to_pil
from raydec.runtime import JobConfig, ModelNotFoundError, ResumeMismatchError, job_weights, preflight, run_job


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    to_pil(make_sample(seed).image).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Dict[str, str]:
    """A tiny random LLaVA and a random ViSpec draft for it, saved by path."""
    import torch

    from raydec.models.hf_vlm import VisionLanguageTarget
    from raydec.models.vispec_draft import DraftConfig, VispecDraft
    from tests.vlm_toys import build_tiny_llava

    folder = build_tiny_llava(tmp_path_factory.mktemp("tiny_llava"))
    target = VisionLanguageTarget.from_pretrained(folder)
    torch.manual_seed(0)
    draft = tmp_path_factory.mktemp("draft") / "vispec"
    VispecDraft(DraftConfig.for_target(target.text_config, vision=True)).save_pretrained(draft)
    return {"model": str(folder), "draft": str(draft)}


@pytest.fixture(scope="module")
def images_file(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("caption_input")
    (folder / "local.png").write_bytes(png(11))
    table = pa.table({
        "id": ["inline-0", "inline-1", "local", "corrupt", "missing-file", "no-image"],
        "image": [png(1), png(2), None, b"\x89PNG\r\n\x1a\n not really a png", None, None],
        "image_uri": [None, None, str(folder / "local.png"), None, str(folder / "nope.png"), None],
        "prompt": [None, "what colour is the circle ?", None, None, None, None],
    })
    path = folder / "images.parquet"
    pq.write_table(table, path)
    return path


def caption_job(model: str, input_path: str, output_path: str, method: str = "ar", draft: str | None = None, **overrides) -> JobConfig:
    data = dict(
        task="caption", model=model, dtype="float32", seed=3,
        input={"path": input_path}, output={"path": output_path},
        decode={"method": method, "max_new_tokens": 12, "sampling": {"temperature": 0.0}, "draft_model": draft,
                "draft_tree": {"depth": 3, "top_k": 3, "total_tokens": 8}},
        pool={"workers": 1, "batch_size": 4, "cpus_per_worker": 0.5},
    )
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    return JobConfig.model_validate(data)


def by_id(output: OutputConfig) -> Dict[str, dict]:
    rows = read_results(output).to_pylist()
    assert len(rows) == len({r["id"] for r in rows})
    return {r["id"]: r for r in rows}


@pytest.fixture(scope="module")
def ar_run(ray_cluster, tiny_llava, images_file, tmp_path_factory):
    job = caption_job(tiny_llava["model"], str(images_file), str(tmp_path_factory.mktemp("ar") / "out"))
    return job, run_job(job), by_id(job.output)


def test_caption_job_writes_captions_and_bad_rows_get_errors(ar_run):
    job, report, results = ar_run
    assert report.complete and report.results == 6
    good = ("inline-0", "inline-1", "local")
    for row_id in good:
        row = results[row_id]
        assert row["error"] is None and row["caption"] and row["tokens"] >= 1 and row["method"] == "ar"
    assert results["inline-1"]["prompt"] == "what colour is the circle ?"
    assert results["local"]["source"].endswith("local.png")
    assert results["no-image"]["error"].startswith("image: missing")
    assert results["corrupt"]["error"] and "image" in results["corrupt"]["error"]
    assert results["missing-file"]["error"] and "nope.png" in results["missing-file"]["error"]
    assert read_manifest(job.output)["counts"]["results"] == 6


def test_vispec_through_the_pool_writes_ar_captions(ar_run, tiny_llava, images_file, tmp_path):
    _, _, ar_results = ar_run
    job = caption_job(tiny_llava["model"], str(images_file), str(tmp_path / "out"), method="vispec", draft=tiny_llava["draft"])
    report = run_job(job)
    assert report.complete
    results = by_id(job.output)
    for row_id, row in ar_results.items():
        assert results[row_id]["caption"] == row["caption"] and results[row_id]["error"] == row["error"]
        assert results[row_id]["method"] == "vispec"


def test_a_vispec_job_with_an_s3_draft_captions_as_ar_and_a_changed_draft_is_a_speed_fact_under_gumbel_only(
        ar_run, tiny_llava, images_file, s3_config, s3_bucket, tmp_path):
    """``draft_model: s3://...`` on two workers of one node: AR's captions, the draft's objects read once.
    A new ETag in the draft: the gumbel job's resume goes on and records the new identity; a rejection
    job's is refused."""
    from tests.s3_fixture import moto_requests, upload_folder

    _, _, ar_results = ar_run
    keys = upload_folder(s3_config, s3_bucket, "drafts/vispec", tiny_llava["draft"])
    draft = f"s3://{s3_bucket}/drafts/vispec"
    s3 = {"s3": s3_config.model_dump()}
    job = caption_job(tiny_llava["model"], str(images_file), str(tmp_path / "out"), method="vispec", draft=draft, input=s3,
                      pool={"workers": 2})
    assert job.decode.coupling == "gumbel"
    assert run_job(job).complete
    results = by_id(job.output)
    assert {i: (r["caption"], r["error"]) for i, r in results.items()} == {i: (r["caption"], r["error"]) for i, r in ar_results.items()}
    assert {r["method"] for r in results.values() if not r["error"]} == {"vispec"}
    assert sorted(moto_requests("GET", f"/{s3_bucket}/drafts/")) == sorted(f"/{s3_bucket}/{key}" for key in keys)
    first = read_manifest(job.output)["weights"]["draft"]
    rejection = caption_job(tiny_llava["model"], str(images_file), str(tmp_path / "out-rejection"), method="vispec", draft=draft,
                            input=s3, decode={"coupling": "rejection"})
    with ResultWriter(rejection.output, worker_id="earlier") as writer:  # what a run of it left: a row and its manifest
        writer.add(error_result({"id": "earlier", "seed": 0}, "vispec", "earlier run"))
    write_manifest(rejection.output, rejection, {"results": 1}, {}, {"weights": job_weights(rejection)})
    preflight(rejection)  # the same draft: it may resume

    (weights,) = [key for key in keys if key.endswith(".safetensors")]
    from safetensors.torch import load_file, save

    retrained = {name: tensor + 0.01 for name, tensor in load_file(Path(tiny_llava["draft"]) / Path(weights).name).items()}
    s3_client(s3_config).put_object(Bucket=s3_bucket, Key=weights, Body=save(retrained, metadata={"format": "pt"}))
    assert run_job(job).complete
    assert read_manifest(job.output)["weights"]["draft"] not in (first, None)
    with pytest.raises(ResumeMismatchError, match=rf"^weights: .*draft {draft} now holds s3:"):
        preflight(rejection)


def test_caption_job_reads_s3_images_and_writes_to_s3(ar_run, tiny_llava, s3_config, s3_bucket, tmp_path):
    _, _, ar_results = ar_run
    client = s3_client(s3_config)
    client.put_object(Bucket=s3_bucket, Key="img/a.png", Body=png(1))
    table = pa.table({"id": ["s3-a", "s3-missing"], "image_uri": [f"s3://{s3_bucket}/img/a.png", f"s3://{s3_bucket}/img/missing.png"]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    client.put_object(Bucket=s3_bucket, Key="captions-in/images.parquet", Body=buffer.getvalue())
    s3 = s3_config.model_dump()
    job = caption_job(tiny_llava["model"], f"s3://{s3_bucket}/captions-in/", f"s3://{s3_bucket}/captions-out",
                      input={"s3": s3}, output={"s3": s3})
    report = run_job(job)
    assert report.complete and report.results == 2
    results = by_id(job.output)
    assert results["s3-a"]["error"] is None and results["s3-a"]["caption"] == ar_results["inline-0"]["caption"]  # greedy: same image, same caption
    assert results["s3-missing"]["error"] and "missing.png" in results["s3-missing"]["error"]


def test_caption_configs_fail_fast(tiny_llava, images_file, tmp_path):
    with pytest.raises(ModelNotFoundError, match="no vispec draft"):
        preflight(caption_job(tiny_llava["model"], str(images_file), str(tmp_path / "o"), method="vispec", draft=str(tmp_path / "none")))
    with pytest.raises(ModelNotFoundError, match="needs a trained draft"):
        preflight(caption_job(tiny_llava["model"], str(images_file), str(tmp_path / "o"), method="eagle"))
    with pytest.raises(ValueError, match="not a captioning method"):
        preflight(caption_job(tiny_llava["model"], str(images_file), str(tmp_path / "o"), method="sjd_pac"))
    with pytest.raises(ValueError, match="decode.sampling.cfg_scale: 3.0 must be 1 for captioning"):
        preflight(caption_job(tiny_llava["model"], str(images_file), str(tmp_path / "o"), decode={"sampling": {"temperature": 0.0, "cfg_scale": 3.0}}))
    # a draft of the other kind, or for another target, is refused by name before Ray starts ...
    import json
    import shutil

    from raydec.api import load_draft_model, load_target

    with pytest.raises(ValueError, match=r"^decode.draft_model: .* holds a ViSpec \(vision\) draft; decode.method='eagle' needs a text-only"):
        preflight(caption_job(tiny_llava["model"], str(images_file), str(tmp_path / "o"), method="eagle", draft=tiny_llava["draft"]))
    narrow = tmp_path / "narrow"
    shutil.copytree(tiny_llava["draft"], narrow)
    config = json.loads((narrow / "draft_config.json").read_text())
    wide = config["hidden_size"]
    (narrow / "draft_config.json").write_text(json.dumps({**config, "hidden_size": wide // 2}))
    message = rf"^decode.draft_model: .*narrow is a draft for hidden_size={wide // 2}, but the target's text model has hidden_size={wide}"
    with pytest.raises(ValueError, match=message):
        preflight(caption_job(tiny_llava["model"], str(images_file), str(tmp_path / "o"), method="vispec", draft=str(narrow)))
    assert not (tmp_path / "o").exists()
    # ... and by load_draft_model before any weight loads (not deep inside the network)
    target = load_target(tiny_llava["model"], task="caption")
    with pytest.raises(ValueError, match=message):
        load_draft_model(target, "vispec", tiny_llava["model"], str(narrow))
    with pytest.raises(ValueError, match="needs a text-only"):
        load_draft_model(target, "eagle", tiny_llava["model"], tiny_llava["draft"])
    no_images = tmp_path / "no_images.parquet"
    pq.write_table(pa.table({"id": ["x"], "text": ["hello"]}), no_images)
    with pytest.raises(Exception, match="image"):
        preflight(caption_job(tiny_llava["model"], str(no_images), str(tmp_path / "o")))
