"""Batch generation on Ray: a tiny real Janus checkpoint through the actor-pool pipeline.

One Ray cluster serves the module. The baseline run (local input and output, with bad
rows) is shared: later tests compare their images and token counts against it, so
resume, S3 and fault recovery are checked to give the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Dict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raydec.io import OutputConfig, ResultWriter, error_result, read_manifest, read_results, write_manifest
from raydec.io.config import DatasetSchemaError, IOConfigError, OutputNotWritableError, S3Config
from raydec.io.filesystem import s3_client
from raydec.runtime import JobConfig, ModelNotFoundError, ResumeMismatchError, job_weights, preflight, run_job

PROMPTS = [
    "a red circle at the top left .",
    "a small blue square in the center .",
    "a large green triangle on a white background .",
    "a purple cross at the bottom right .",
    "",  # bad: empty
    " ".join(["red"] * 30),  # bad: too many words for max_prompt_words=20
]
IDS = [f"row-{i}" for i in range(len(PROMPTS))]
GOOD_IDS = IDS[:4]


@pytest.fixture(scope="module")
def tiny_janus(tmp_path_factory) -> str:
    """A tiny random-weight JanusForConditionalGeneration saved with save_pretrained."""
    from tests.tiny_models import build_tiny_janus

    return str(build_tiny_janus(tmp_path_factory.mktemp("tiny_janus")))


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("input") / "prompts.parquet"
    pq.write_table(pa.table({"id": IDS, "prompt": PROMPTS}), path)
    return path


def earlier_output(job: JobConfig, extra: Dict | None = None) -> None:
    """``job``'s output as an earlier run leaves it: one result row on record, then its manifest."""
    with ResultWriter(job.output, worker_id="earlier") as writer:
        writer.add(error_result({"id": "earlier", "prompt": "x", "seed": 0}, job.decode.method, "earlier run"))
    write_manifest(job.output, job, {"results": 1}, {}, extra)


def make_job(model: str, input_path: str, output_path: str, **overrides) -> JobConfig:
    data = dict(
        task="t2i", model=model, dtype="float64", seed=7,
        input={"path": input_path, "max_prompt_words": 20},
        output={"path": output_path, "shard_size": 256},
        decode={"method": "ar"},
        pool={"workers": 2, "batch_size": 2, "cpus_per_worker": 0.5},
    )
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    return JobConfig.model_validate(data)


def results_by_id(output: OutputConfig) -> Dict[str, dict]:
    table = read_results(output)
    rows = table.to_pylist()
    assert len(rows) == len({r["id"] for r in rows}), "read_results must give one row per id"
    return {r["id"]: r for r in rows}


def image_bytes(uri: str, s3: S3Config) -> bytes:
    if uri.startswith("s3://"):
        bucket, key = uri[len("s3://"):].split("/", 1)
        return s3_client(s3).get_object(Bucket=bucket, Key=key)["Body"].read()
    return Path(uri).read_bytes()


@pytest.fixture(scope="module")
def baseline(ray_cluster, tiny_janus, prompts_file, tmp_path_factory):
    """An uninterrupted local run: (job, report, results by id, image bytes by id)."""
    job = make_job(tiny_janus, str(prompts_file), str(tmp_path_factory.mktemp("baseline") / "out"))
    report = run_job(job)
    results = results_by_id(job.output)
    images = {i: image_bytes(results[i]["output_uri"], job.output.s3) for i in GOOD_IDS}
    return job, report, results, images


def test_a_job_with_the_default_config_decodes_with_the_plan_and_pixels_of_generate_images(ray_cluster, tiny_janus, tmp_path):
    """``decode: {method: sjd_pac}``, sampled: the job's manifest records the method's default shape
    (the plan ``generate_images`` reports for the same config) and its images are those
    ``generate_images`` makes for the same seeds (the Serve app and ``raydec generate``:
    tests/serve/test_one_plan.py)."""
    from raydec.api import generate_images
    from raydec.io import encode_png

    prompts, seeds = ["a red circle", "two blue squares"], [21, 22]
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": prompts, "seed": seeds}), tmp_path / "prompts.parquet")
    job = make_job(tiny_janus, str(tmp_path / "prompts.parquet"), str(tmp_path / "out"), dtype="float32",
                   decode={"method": "sjd_pac"}, pool={"workers": 1, "batch_size": 8})
    run_job(job)
    expected = generate_images(prompts, model=tiny_janus, decode={"method": "sjd_pac"}, seeds=seeds, batch_size=8)
    plan = read_manifest(job.output)["plan"]
    assert (plan["label"], plan["shape_from"], plan["batch_size"]) == (expected[0].plan, "default", 8)
    assert expected[0].plan.startswith("sjd_pac window=16")
    results = results_by_id(job.output)
    assert [Path(results[i]["output_uri"]).read_bytes() for i in ("a", "b")] == [encode_png(r.image) for r in expected]


def test_local_job_writes_one_result_per_row_and_bad_rows_get_errors(baseline):
    job, report, results, images = baseline
    assert report.complete and report.input_rows == 6 and report.results == 6
    assert report.validation_errors == 2 and report.processed == 4 and report.processing_errors == 0
    assert sorted(results) == sorted(IDS)
    assert results["row-4"]["error"] == "prompt: empty"
    assert "max_prompt_words=20" in results["row-5"]["error"]
    for row_id in GOOD_IDS:
        row = results[row_id]
        assert row["error"] is None and row["tokens"] == 256 and row["method"] == "ar"
        assert row["target_forwards"] >= 1 and row["latency_s"] > 0
        assert images[row_id].startswith(b"\x89PNG")
    from PIL import Image
    import io

    assert Image.open(io.BytesIO(images["row-0"])).size == (64, 64)
    assert len(set(images.values())) == 4, "different prompts / seeds should give different images"
    manifest = read_manifest(job.output)
    assert manifest["counts"]["results"] == 6 and manifest["method"] == "ar"
    assert manifest["config"]["pool"]["workers"] == 2
    assert manifest["status"] == "complete" and manifest["weights"] == job_weights(job)
    assert sum(manifest["rows_per_worker"].values()) == report.processed == 4  # throughput per actor on record
    assert manifest["rows_per_s"] > 0 and report.output == str(Path(job.output.path).resolve())


def test_s3_job_reads_prompts_and_writes_results_to_s3(baseline, tiny_janus, prompts_file, s3_config, s3_bucket):
    _, _, base_results, base_images = baseline
    s3_client(s3_config).put_object(Bucket=s3_bucket, Key="in/prompts.parquet", Body=prompts_file.read_bytes())
    s3 = s3_config.model_dump()
    job = make_job(
        tiny_janus, f"s3://{s3_bucket}/in/", f"s3://{s3_bucket}/out",
        input={"s3": s3}, output={"s3": s3}, pool={"workers": 1, "batch_size": 4},
    )
    report = run_job(job)
    assert report.complete and report.results == 6
    results = results_by_id(job.output)
    assert sorted(results) == sorted(IDS)
    for row_id in GOOD_IDS:
        assert results[row_id]["output_uri"] == f"s3://{s3_bucket}/out/images/{row_id}.png"
        assert image_bytes(results[row_id]["output_uri"], s3_config) == base_images[row_id]
        assert results[row_id]["tokens"] == base_results[row_id]["tokens"]
    assert read_manifest(job.output)["counts"]["results"] == 6
    keys = [o["Key"] for o in s3_client(s3_config).list_objects_v2(Bucket=s3_bucket, Prefix="out/")["Contents"]]
    assert "out/manifest.json" in keys and any(k.startswith("out/results/part-") for k in keys)


def test_a_job_with_an_s3_model_decodes_as_its_folder_and_its_node_downloads_it_once(baseline, tiny_janus, prompts_file, s3_config,
                                                                                     s3_bucket, tmp_path):
    """``model: s3://...`` with two workers on one node: the driver reads the configs, the workers the
    weights, every object once; the rows are the folder's. A changed object is another model: the
    resume is refused, naming it."""
    from tests.s3_fixture import moto_requests, upload_folder

    _, _, base_results, base_images = baseline
    keys = upload_folder(s3_config, s3_bucket, "models/tiny-janus", tiny_janus)
    name = f"s3://{s3_bucket}/models/tiny-janus"
    job = make_job(name, str(prompts_file), str(tmp_path / "out"), input={"s3": s3_config.model_dump()})
    assert job.pool.workers == 2
    report = run_job(job)
    assert report.complete and report.processed == 4
    results = results_by_id(job.output)
    for row_id in GOOD_IDS:
        assert image_bytes(results[row_id]["output_uri"], s3_config) == base_images[row_id]
        assert results[row_id]["tokens"] == base_results[row_id]["tokens"]
    assert sorted(moto_requests("GET", f"/{s3_bucket}/models/")) == sorted(f"/{s3_bucket}/{key}" for key in keys)
    manifest = read_manifest(job.output)
    recorded = manifest["models"]["model"]
    assert recorded["name"] == name and recorded["source"] == "s3" and recorded["revision"] == manifest["weights"]["model"]
    assert (Path(recorded["path"]) / "model.safetensors").is_file()

    (weights,) = [key for key in keys if key.endswith(".safetensors")]
    s3_client(s3_config).put_object(Bucket=s3_bucket, Key=weights, Body=b"retrained" + Path(recorded["path"], "model.safetensors").read_bytes())
    with pytest.raises(ResumeMismatchError, match=rf"^weights: .*model {name} now holds s3:"):
        preflight(job)


def test_shipped_job_configs_validate_and_gpu_requests_fall_back_to_cpu(caplog):
    from raydec.runtime.pipeline import _remote_args

    folder = Path(__file__).resolve().parents[2] / "jobs" / "configs"
    configs = sorted(folder.glob("t2i_*.yaml")) + sorted(folder.glob("caption_*.yaml"))  # batch jobs
    assert len(configs) >= 4, "jobs/configs/{t2i,caption}_*.yaml should exist"
    jobs = {path.name: JobConfig.from_yaml(path) for path in configs}
    reference = jobs["t2i_reference.yaml"]
    assert reference.model == "reference" and reference.task == "t2i"
    captions = jobs["caption_reference.yaml"]
    assert captions.task == "caption" and captions.decode.method == "vispec"
    gpu_job = jobs["t2i_s3.yaml"]
    assert gpu_job.pool.gpus_per_worker == 0.25
    assert _remote_args(gpu_job, cluster_gpus=1.0)["num_gpus"] == 0.25
    assert "num_gpus" not in _remote_args(gpu_job, cluster_gpus=0.0)
    assert "running on CPU" in caplog.text
    whole_gpu = gpu_job.model_copy(update={"pool": gpu_job.pool.model_copy(update={"gpus_per_worker": 1.0, "workers": 4})})
    with pytest.raises(IOConfigError, match=r"pool.gpus_per_worker=1.0: no node of the Ray cluster has more than 0.5 GPU"):
        _remote_args(whole_gpu, cluster_gpus=1.0, node_gpus=0.5)  # an actor that could never start
    assert _remote_args(whole_gpu, cluster_gpus=2.0, node_gpus=1.0)["num_gpus"] == 1.0
    assert "2 actor(s) run, the rest wait for GPUs" in caplog.text
    with pytest.raises(ValueError, match="gpus_per_worker"):  # one actor's model runs on one GPU
        make_job("reference", "p.parquet", "out", pool={"gpus_per_worker": 2})


def test_device_failures_fail_the_batch_and_row_failures_become_error_rows(caplog):
    import torch

    from raydec.runtime.row_decoders import worker_device
    from raydec.runtime.worker import GenerationWorker, is_device_failure

    assert is_device_failure(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_device_failure(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_device_failure(ValueError("prompt[0]: too long")) and not is_device_failure(RuntimeError("shape mismatch"))

    class Failing:  # the batch-level error routing only: a real out-of-memory needs a GPU
        method = "ar"

        def __init__(self, exc):
            self.exc = exc

        def __call__(self, rows):
            raise self.exc

    worker = object.__new__(GenerationWorker)
    worker.worker_id = "test"
    rows = [{"id": "a", "prompt": "a cat", "seed": 1}]
    worker.decoder = Failing(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    with pytest.raises(torch.cuda.OutOfMemoryError):  # Ray retries the batch; nothing is recorded as the row's
        worker._process(rows)
    worker.decoder = Failing(ValueError("bad row"))
    assert worker._process(rows)[0]["error"] == "ValueError: bad row"
    gpu_job = make_job("reference", "p.parquet", "out", pool={"gpus_per_worker": 0.5})
    assert worker_device(gpu_job.processor_config()) == "cpu" and "this actor has no GPU" in caplog.text  # Ray assigned none here


def test_bad_configs_fail_fast_before_any_model_loads(tmp_path, prompts_file, tiny_janus):
    missing_model = str(tmp_path / "no-such-model")  # loading it would fail differently
    no_prompt = tmp_path / "no_prompt.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["a red circle ."]}), no_prompt)
    with pytest.raises(DatasetSchemaError, match="'prompt'"):
        run_job(make_job(missing_model, str(no_prompt), str(tmp_path / "out1")))
    config = tmp_path / "job.yaml"
    config.write_text(
        f"model: {missing_model}\ninput:\n  path: {prompts_file}\noutput:\n  path: {tmp_path / 'out2'}\n"
        "pool:\n  wrokers: 2\n"
    )
    with pytest.raises(IOConfigError, match=r"pool\.wrokers"):
        JobConfig.from_yaml(config)
    unreachable = {"endpoint_url": "http://127.0.0.1:9", "access_key_id": "x", "secret_access_key": "y",
                   "connect_timeout_s": 0.5, "max_attempts": 1}
    job = make_job(tiny_janus, str(prompts_file), "s3://bucket/out", output={"s3": unreachable})
    with pytest.raises(OutputNotWritableError, match="s3://bucket/out"):
        preflight(job)
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        run_job(make_job(missing_model, str(prompts_file), str(tmp_path / "out3")))
    assert not (tmp_path / "out3").exists()  # a job that cannot run leaves no output behind
    with pytest.raises(ValueError, match="decode.method: 'vispec' is not a text-to-image method"):
        preflight(make_job(tiny_janus, str(prompts_file), str(tmp_path / "out4"), decode={"method": "vispec"}))
    with pytest.raises(ValueError, match="decode.max_new_tokens: 7 set, but an image's length is the model's image layout"):
        preflight(make_job(tiny_janus, str(prompts_file), str(tmp_path / "out4"), decode={"method": "ar", "max_new_tokens": 7}))
    assert not (tmp_path / "out1" / "results").exists()


def test_output_inside_the_input_is_refused(tmp_path):
    from pydantic import ValidationError

    def job(input_path, output_path):
        return JobConfig(model="reference", input={"path": input_path}, output={"path": output_path})

    data = tmp_path / "data"
    for input_path, output_path in [
        (str(data), str(data / "out")),  # a re-run would list out/results/*.parquet as input
        (str(data), str(data)),
        (f"{data}/*.parquet", str(data / "out")),
        ("s3://bucket/prompts", "s3://bucket/prompts/out/"),
    ]:
        with pytest.raises(ValidationError, match=r"output.path: .* lies inside input.path"):
            job(input_path, output_path)
    assert job(str(data / "prompts.parquet"), str(data / "out"))  # a single file lists nothing below it
    assert job(str(data / "results"), str(data / "captions"))  # the demo's caption job
    assert job("s3://bucket/prompts", "s3://bucket/prompts-out")


def test_job_entrypoint_reports_bad_configs_in_one_line_before_ray_starts(tmp_path, prompts_file, tiny_janus):
    from raydec.runtime.entrypoint import job_main

    config = tmp_path / "job.yaml"
    config.write_text(
        f"task: t2i\nmodel: {tiny_janus}\ninput:\n  path: {prompts_file}\noutput:\n  path: {tmp_path / 'out'}\n"
        "decode:\n  method: eagle\n"
    )
    with pytest.raises(SystemExit, match=rf"^config: {config} is invalid:\n  decode.method: 'eagle' is not a text-to-image method"):
        job_main("t2i", "test", ["--config", str(config)])
    config.write_text(config.read_text().replace("method: eagle", "method: ar"))
    with pytest.raises(SystemExit, match=r"--input '': input.path: String should have at least 1 character \(got ''\)$"):
        job_main("t2i", "test", ["--config", str(config), "--input", ""])  # an empty override is validated, not ignored
    with pytest.raises(SystemExit, match=r"^.*job.yaml: --output 'ftp://x/y': output.path: .*ftp://x/y"):
        job_main("t2i", "test", ["--config", str(config), "--output", "ftp://x/y"])
    config.write_text(config.read_text() + "  sampling:\n    temperature: .nan\n")
    with pytest.raises(SystemExit, match=r"decode.sampling.temperature: Input should be a finite number \(got nan\)"):
        job_main("t2i", "test", ["--config", str(config)])
    config.write_text(config.read_text().replace("  sampling:\n    temperature: .nan\n", ""))
    with pytest.raises(SystemExit, match=r"^task: 't2i' in .*this entrypoint runs 'caption' jobs"):
        job_main("caption", "test", ["--config", str(config)])
    with pytest.raises(SystemExit, match=str(tmp_path / "missing.yaml")):
        job_main("t2i", "test", ["--config", str(tmp_path / "missing.yaml")])
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was created


def test_rerun_after_lost_shards_redoes_only_missing_rows(baseline, tmp_path):
    job, _, base_results, base_images = baseline
    output = tmp_path / "out"
    shutil.copytree(job.output.path, output)
    shards = sorted((output / "results").glob("part-*.parquet"))
    generated = [s for s in shards if not s.name.startswith("part-driver")]
    assert len(generated) >= 2
    for shard in generated[:2]:
        shard.unlink()
    for image in (output / "images").glob("*.png"):
        image.unlink()
    rerun = job.model_copy(update={"output": job.output.model_copy(update={"path": str(output)})})
    # a resume with another coupling or seed would mix two jobs' rows in one output; under the default
    # gumbel coupling another method is a speed fact: its rows are the same
    other_decode = make_job(job.model, job.input.path, str(output), decode={"coupling": "rejection"})
    with pytest.raises(ResumeMismatchError, match=r"^decode\.coupling: .*decode\.coupling='gumbel', this job has decode\.coupling='rejection'"):
        preflight(other_decode)
    preflight(make_job(job.model, job.input.path, str(output), decode={"method": "sjd"}))
    with pytest.raises(ResumeMismatchError, match=r"^seed: .*seed=7.*seed=8"):
        preflight(make_job(job.model, job.input.path, str(output), seed=8))
    other_input = tmp_path / "other" / "prompts.parquet"  # the same rows elsewhere: another job's input all the same
    other_input.parent.mkdir()
    shutil.copy(job.input.path, other_input)
    with pytest.raises(ResumeMismatchError, match=r"^input\.path: .*holds results written with input\.path="):
        preflight(make_job(job.model, str(other_input), str(output)))
    preflight(make_job(job.model, job.input.path, str(output), pool={"workers": 1}))  # the pool may change
    lost = len(read_results(job.output)) - len(read_results(rerun.output))
    assert lost >= 2
    report = run_job(rerun)
    # the lost shards may hold bad rows' error results too (read tasks validate, the workers write them)
    assert report.complete and report.skipped_completed == 6 - lost and report.processed + report.validation_errors == lost
    results = results_by_id(rerun.output)
    assert sorted(results) == sorted(IDS)
    for row_id in GOOD_IDS:
        assert results[row_id]["tokens"] == base_results[row_id]["tokens"]
        assert Path(results[row_id]["output_uri"]).read_bytes() == base_images[row_id]
    again = run_job(rerun)  # nothing left: no actors, same results
    assert again.processed == 0 and again.skipped_completed == 6 and again.complete
    retried = run_job(rerun.model_copy(update={"retry_errors": True}))  # bad rows are redone, still no model
    assert retried.processed == 0 and retried.validation_errors == 2 and retried.skipped_completed == 4
    assert len(read_results(rerun.output)) == 6


def test_a_job_names_itself_in_its_manifest_before_it_writes_error_rows(tiny_janus, tmp_path, monkeypatch):
    from raydec.runtime import pipeline

    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text('{"id": "a", "prompt": ""}\n{not json\n')  # no row reaches a model
    job = make_job(tiny_janus, str(only_bad), str(tmp_path / "out"))

    def driver_dies(*args, **kwargs):
        raise KeyboardInterrupt("driver killed after the error rows were written")

    monkeypatch.setattr(pipeline, "_verify", driver_dies)
    with pytest.raises(KeyboardInterrupt):
        run_job(job)
    assert len(read_results(job.output)) == 2 and read_manifest(job.output)["status"] == "running"
    with pytest.raises(ResumeMismatchError, match="seed"):  # the error rows are on record as this job's
        preflight(make_job(tiny_janus, str(only_bad), str(tmp_path / "out"), seed=8))


def test_a_manifest_without_results_does_not_block_a_corrected_job(tiny_janus, prompts_file, tmp_path, caplog):
    """A run that wrote its manifest and then no row (its workers failed to load) leaves
    nothing to mix with: the corrected job takes the output over. Once a row is on record,
    the refusal names the nested field that differs."""
    out = str(tmp_path / "out")
    failed = make_job(tiny_janus, str(prompts_file), out, decode={"method": "sjd", "coupling": "rejection"})
    write_manifest(failed.output, failed, {"results": 0}, {}, {"status": "running"})
    corrected = make_job(tiny_janus, str(prompts_file), out, decode={"method": "sjd_pac", "coupling": "rejection"})
    with caplog.at_level("INFO", logger="raydec.runtime.pipeline"):
        preflight(corrected)
    assert any("no results yet" in r.getMessage() for r in caplog.records)
    earlier_output(failed)
    with pytest.raises(ResumeMismatchError, match=r"^decode\.method: .*decode\.method='sjd', this job has decode\.method='sjd_pac'; write to") as refused:
        preflight(corrected)
    assert refused.value.field == "decode"


def test_resume_is_refused_once_the_model_folder_holds_other_weights(tiny_janus, prompts_file, tmp_path):
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_janus, model)
    job = make_job(str(model), str(prompts_file), str(tmp_path / "out"))
    earlier_output(job, {"weights": job_weights(job), "status": "running"})
    preflight(job)  # same folder, same weights: the resume may go on
    (weights_file,) = model.glob("*.safetensors")
    retrained = {name: tensor + 0.01 for name, tensor in load_file(weights_file).items()}
    save_file(retrained, weights_file, metadata={"format": "pt"})
    with pytest.raises(ResumeMismatchError, match=r"^weights: .*model weights [0-9a-f]{16}.*now holds [0-9a-f]{16}"):
        preflight(job)


def test_demo_replaces_results_of_earlier_weights_but_not_of_other_settings(tiny_janus, prompts_file, tmp_path, capsys):
    """The shipped reference weights change with raydec: `make demo` after an update replaces its
    own stale results. Other settings, or a refusal without that permission, leave them alone."""
    from raydec.demo import resume_or_replace

    out = tmp_path / "out"
    job = make_job(tiny_janus, str(prompts_file), str(out))
    earlier_output(job, {"weights": {"model": "0" * 16}, "status": "complete"})
    cleared = []

    def clear() -> None:
        cleared.append(True)
        shutil.rmtree(out)

    with pytest.raises(ResumeMismatchError) as refused:
        resume_or_replace(lambda: preflight(job), clear, out, replace_stale_weights=False)
    assert refused.value.field == "weights" and not cleared
    assert resume_or_replace(lambda: preflight(job), clear, out, replace_stale_weights=True) == preflight(job)
    assert cleared == [True]
    err = capsys.readouterr().err
    assert f"{out} holds results of earlier shipped weights; replacing them (weights: " in err
    assert "write to a new output.path" not in err  # the demo acts on that advice itself

    earlier_output(job, {"weights": {"model": "0" * 16}, "status": "complete"})
    other_seed = make_job(tiny_janus, str(prompts_file), str(out), seed=8)
    with pytest.raises(ResumeMismatchError) as refused:
        resume_or_replace(lambda: preflight(other_seed), clear, out, replace_stale_weights=True)
    assert refused.value.field == "seed" and cleared == [True] and (out / "manifest.json").exists()


def test_resume_of_an_output_without_recorded_weights_warns(tiny_janus, prompts_file, tmp_path, caplog):
    job = make_job(tiny_janus, str(prompts_file), str(tmp_path / "out"))
    earlier_output(job, {"status": "running"})  # as older raydec wrote it
    with caplog.at_level("WARNING", logger="raydec.runtime.pipeline"):
        preflight(job)
    assert any("did not record its weights" in r.getMessage() for r in caplog.records)


class WorkerKiller(threading.Thread):
    """Kills the job's worker process with SIGKILL (as the kernel's OOM killer or a lost node
    leaves it: no cleanup, no flush) once its result shards hold ``rows`` rows, and records the
    rows it had written by then."""

    def __init__(self, output: Path, rows: int, settle_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.results, self.rows, self.settle_s = output / "results", rows, settle_s
        self.killed: list = []
        self.written: Dict[str, dict] = {}  # id -> the row the killed worker had written
        self.done = threading.Event()

    def worker_shards(self) -> list:
        return sorted(p for p in self.results.glob("part-*.parquet") if not p.name.startswith("part-driver"))

    def run(self) -> None:
        from tests.ray_fixture import actor_pids

        while not self.done.is_set():
            if sum(pq.read_metadata(p).num_rows for p in self.worker_shards()) >= self.rows:
                self.done.wait(self.settle_s)  # its call returns: the driver counts the batch as done
                pids = actor_pids("GenerationWorker")
                if pids:
                    self.written = {r["id"]: r for p in self.worker_shards() for r in pq.read_table(p).to_pylist()}
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    self.killed = pids
                    return
            self.done.wait(0.02)


def test_killed_worker_is_replaced_and_its_rows_redone(baseline, tiny_janus, prompts_file, tmp_path):
    """One worker, batches of two rows: it is killed once its first batch is durable, in the
    middle of the job. A replacement redoes what was lost; nothing written is lost or doubled."""
    _, _, base_results, base_images = baseline
    out = tmp_path / "out"
    job = make_job(tiny_janus, str(prompts_file), str(out), pool={"workers": 1, "batch_size": 2})
    killer = WorkerKiller(out, rows=2)
    killer.start()
    try:
        report = run_job(job)
    finally:
        killer.done.set()
        killer.join()
    assert len(killer.killed) == 1, "the worker should have been killed once, mid-job"
    assert 2 <= len(killer.written) < len(IDS), f"killed after its first batch, before the last: {sorted(killer.written)}"
    assert report.complete and report.results == 6
    writers = {shard.name.rsplit("-", 1)[0] for shard in (out / "results").glob("part-*.parquet")}
    writers = {w for w in writers if not w.startswith("part-driver")}
    assert len(writers) == 2, f"a replacement worker should have written the redone rows: {writers}"
    assert report.workers_seen == 2
    results = results_by_id(job.output)  # one row per id
    assert sorted(results) == sorted(IDS)
    for row_id, row in killer.written.items():  # what the killed worker wrote is what the job keeps
        assert results[row_id] == row
    for row_id in GOOD_IDS:
        assert results[row_id]["error"] is None
        assert Path(results[row_id]["output_uri"]).read_bytes() == base_images[row_id]


def test_demo_without_model_explains_how_to_train(tmp_path, capsys):
    from raydec.demo import main

    prompts = tmp_path / "prompts.parquet"
    code = main(["--model", str(tmp_path / "missing"), "--prompts", str(prompts), "--out", str(tmp_path / "out")])
    assert code == 2
    assert "python -m raydec.reference.train t2i" in capsys.readouterr().err
    assert pq.read_table(prompts).num_rows == 16, "the example prompts are written even without a model"


def test_demo_refuses_an_out_folder_written_with_another_model(tiny_janus, tmp_path, capsys):
    from raydec.demo import main

    out, prompts = tmp_path / "out", tmp_path / "p.parquet"
    earlier = make_job("reference", str(prompts), str(out))
    earlier_output(earlier)
    code = main(["--model", tiny_janus, "--prompts", str(prompts), "--out", str(out), "--rows", "4"])
    assert code == 2
    err = capsys.readouterr().err
    assert "model: " in err and "'reference'" in err and "--fresh" in err
    assert [p.name for p in (out / "results").iterdir()] == ["part-earlier-00000.parquet"], "nothing is generated into a mismatched output"


def test_demo_runs_end_to_end_on_a_tiny_model(ray_cluster, tiny_janus, tmp_path, capsys):
    from raydec.demo import main

    out = tmp_path / "out"
    code = main(["--model", tiny_janus, "--prompts", str(tmp_path / "p.parquet"), "--out", str(out),
                 "--rows", "4", "--workers", "1", "--batch-size", "4", "--caption-method", "ar", "--speedup-rows", "1"])
    assert code == 0
    summary = capsys.readouterr().out
    assert "4 result(s)" in summary and "sjd_pac" in summary
    assert "captioning: 4 result(s)" in summary and "latency speedup" in summary
    assert (out / "contact_sheet.png").stat().st_size > 0 and (out / "manifest.json").exists()
    assert len(read_results(OutputConfig(path=str(out)))) == 4
    captions = read_results(OutputConfig(path=str(out / "captions"))).to_pylist()
    assert len(captions) == 4 and all(r["error"] is None and r["caption"] for r in captions)
    # the speedups re-run the job's own first row: its prompt, and the image it wrote
    assert "sjd_pac vs AR on 1 prompts" in summary and "ar vs AR on 1 images" in summary
    assert "1/1 captions identical to AR's" in summary


def test_demo_checks_its_options_before_fresh_deletes_anything(tmp_path, capsys):
    from raydec.demo import main

    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "manifest.json").write_text("{}")
    code = main(["--prompts", str(tmp_path / "p.parquet"), "--out", str(out), "--fresh", "--method", "sjdpac"])
    assert code == 2 and "raydec demo: bad option: decode.method" in capsys.readouterr().err
    assert (out / "manifest.json").exists() and (out / "results").is_dir()  # nothing deleted
    # a method of the other task is a bad option too, for either job
    for option in (["--method", "vispec"], ["--caption-method", "sjd"]):
        code = main(["--prompts", str(tmp_path / "p.parquet"), "--out", str(out), "--fresh", *option])
        err = capsys.readouterr().err
        assert code == 2 and "raydec demo: bad option: decode.method" in err and "is not a" in err, err
        assert (out / "manifest.json").exists() and (out / "results").is_dir()
    with pytest.raises(SystemExit):
        main(["--out", str(out), "--batch-size", "0"])
    assert "argument --batch-size: expected an integer >= 1, got 0" in capsys.readouterr().err


def test_killed_driver_rerun_gives_one_result_per_row_equal_to_an_uninterrupted_run(baseline, tiny_janus, prompts_file, tmp_path):
    """The job's driver (jobs/t2i_batch.py, a separate process on this Ray cluster) is SIGKILLed
    once the first batch is durable; re-running the same job completes it."""
    import signal
    import subprocess
    import sys
    import time

    import ray
    import yaml

    _, _, base_results, base_images = baseline
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    config = tmp_path / "job.yaml"  # what make_job builds, as a user would write it
    config.write_text(yaml.safe_dump(dict(
        task="t2i", model=tiny_janus, dtype="float64", seed=7,
        input={"path": str(prompts_file), "max_prompt_words": 20}, output={"path": str(out), "shard_size": 256},
        decode={"method": "ar"}, pool={"workers": 1, "batch_size": 2, "cpus_per_worker": 0.5},
    )))
    job = JobConfig.from_yaml(config)
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    driver = subprocess.Popen([sys.executable, "jobs/t2i_batch.py", "--config", str(config)], cwd=repo, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    generated = []
    while time.monotonic() < deadline and driver.poll() is None:
        generated = [s for s in out.glob("results/part-*.parquet") if not s.name.startswith("part-driver")]
        if generated:
            break
        time.sleep(0.1)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    assert generated, "the driver should have written a generated batch before it was killed"
    partial = len(read_results(job.output))
    assert partial < len(IDS), "killed mid-job: some rows must be missing"
    report = run_job(job)
    assert report.complete and report.skipped_completed == partial
    results = results_by_id(job.output)
    assert sorted(results) == sorted(IDS)
    for row_id in GOOD_IDS:
        assert results[row_id]["error"] is None and results[row_id]["tokens"] == base_results[row_id]["tokens"]
        assert Path(results[row_id]["output_uri"]).read_bytes() == base_images[row_id]
    assert results["row-4"]["error"] == base_results["row-4"]["error"]


def test_resume_identity_resolves_the_draft_tree_only_where_one_is_built():
    """A manifest from before the temperature-dependent tree default: an SJD job resumes, a
    greedy ViSpec job written with the old 5/2/10 tree does not (its rows used another tree)."""
    from raydec.runtime.resume import _differs, _resume_identity

    old_tree = {"depth": 5, "top_k": 2, "total_tokens": 10}
    greedy = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "cfg_scale": 1.0, "cfg_space": "logits"}

    def identity(method, tree):
        return _resume_identity({"decode": {"method": method, "sampling": greedy, "draft_tree": tree}, "input": {"seed": 1}})

    assert not _differs(identity("sjd_pac", old_tree)["decode"], identity("sjd_pac", None)["decode"])
    assert _differs(identity("vispec", old_tree)["decode"], identity("vispec", None)["decode"])
    assert identity("vispec", None)["decode"]["draft_tree"] == {"depth": 6, "top_k": 2, "total_tokens": 12}
    assert not _differs(identity("vispec", {"depth": 6, "top_k": 2, "total_tokens": 12})["decode"], identity("vispec", None)["decode"])

    # a manifest of an earlier release names the Jacobi shape `draft`: the same shape resumes, another does not
    def jacobi_identity(key, window):
        return _resume_identity({"decode": {"method": "sjd", key: {"window": window}}, "input": {"seed": 1}})["decode"]

    assert not _differs(jacobi_identity("draft", 16), jacobi_identity("jacobi", 16))
    assert _differs(jacobi_identity("draft", 8), jacobi_identity("jacobi", 16))


def test_a_gumbel_coupled_output_resumes_with_another_method_or_shape_and_not_across_couplings():
    """In gumbel coupling a row is its seed's whatever drafted it: the method and shape are speed
    facts (still recorded), not identity; the coupling itself is identity, and a manifest from
    before couplings counts as rejection."""
    from raydec.runtime.resume import _differs, _resume_identity

    def identity(method, window, coupling=None):
        decode = {"method": method, "jacobi": {"window": window}, **({"coupling": coupling} if coupling else {})}
        return _resume_identity({"decode": decode, "input": {"seed": 1}})["decode"]

    assert not _differs(identity("sjd_pac", 16, "gumbel"), identity("sjd", 48, "gumbel"))
    assert not _differs(identity("sjd", 16, "gumbel"), identity("ar", 16, "gumbel"))
    assert _differs(identity("sjd", 16, "rejection"), identity("sjd", 48, "rejection"))
    assert _differs(identity("sjd", 16), identity("sjd", 16, "gumbel"))  # written before couplings: rejection
    assert _differs(identity("sjd", 16, "gumbel"), identity("sjd", 16, "rejection"))


def test_contact_sheet_fits_whole_captions_and_marks_cut_ones():
    from PIL import Image

    from raydec.runtime.contact_sheet import contact_sheet, wrap_text

    caption = " ".join(f"word{i}" for i in range(40))  # about 9 lines at 26 characters
    whole = wrap_text(caption, 26)
    assert " ".join(whole) == caption and len(whole) > 6
    cut = wrap_text(caption, 26, max_lines=2)
    assert len(cut) == 2 and cut[0] == whole[0] and cut[1].endswith("...") and len(cut[1]) <= 26

    tile = Image.new("RGB", (8, 8), "red")
    short_sheet = contact_sheet([tile, None], ["short", "also short"])
    long_sheet = contact_sheet([tile, None], ["short", caption])
    # the cell grows by one line height per extra line of the longest caption
    assert long_sheet.height - short_sheet.height == 12 * (len(whole) - 1)
    assert contact_sheet([tile], [caption], caption_lines=2).height == short_sheet.height + 12
    with pytest.raises(ValueError, match="caption_lines"):
        contact_sheet([tile], [caption], caption_lines=0)


def test_draft_auto_is_tuned_once_recorded_in_the_manifest_and_reused_by_a_rerun_and_a_second_job_with_batch_auto(
    prompts_file, tmp_path, monkeypatch,
):
    import torch

    from tests.t2i_toys import tiny_janus as toy_janus

    from raydec.api import generate_images, load_target
    from raydec.api.draft_shapes import apply_shape
    from raydec.config import DecodeConfig
    from raydec.io import encode_png
    from raydec.io.validation import derive_seed

    monkeypatch.setenv("RAYDEC_CACHE_DIR", str(tmp_path / "cache"))
    tiny_janus = str(toy_janus(tmp_path / "janus"))  # 16 image tokens: tuning takes seconds
    auto = {"method": "sjd_pac", "jacobi": "auto"}
    first = make_job(tiny_janus, str(prompts_file), str(tmp_path / "first"), decode=auto, pool={"workers": 1}, max_rows=2)
    run_job(first)  # stops after two rows, as a killed run would leave it
    shape = read_manifest(first.output)["plan"]
    assert shape["shape_from"] == "tuned" and shape["batch_size"] == 2 and shape["method"] in ("ar", "sjd_pac")
    assert read_manifest(first.output)["config"]["decode"]["jacobi"] == "auto"
    partial = len(read_results(first.output))

    rerun = make_job(tiny_janus, str(prompts_file), str(tmp_path / "first"), decode=auto, pool={"workers": 1})
    report = run_job(rerun)
    assert report.complete and report.skipped_completed == partial and report.plan["shape_from"] == "manifest"

    fixed = apply_shape(DecodeConfig(**auto), shape)  # the rows, as one uninterrupted run with the recorded shape
    rows = {row_id: (prompt, derive_seed(row_id, 7)) for row_id, prompt in zip(GOOD_IDS, PROMPTS)}
    expected = generate_images([p for p, _ in rows.values()], model=load_target(tiny_janus, dtype=torch.float64),
                               decode=fixed, seeds=[s for _, s in rows.values()])
    resumed = results_by_id(rerun.output)
    for row_id, image in zip(rows, expected):
        assert resumed[row_id]["tokens"] == image.num_tokens
        assert Path(resumed[row_id]["output_uri"]).read_bytes() == encode_png(image.image)

    # batch_size 'auto': the cache knows batch 2 only, so the batch is 2 and its shape comes from the cache
    second = make_job(tiny_janus, str(prompts_file), str(tmp_path / "second"), decode=auto, pool={"workers": 1, "batch_size": "auto"})
    report = run_job(second)
    assert report.plan["shape_from"] == "cache"  # same weights, device, dtype and batch: no tuning
    plan = read_manifest(second.output)["plan"]
    assert {k: plan[k] for k in ("method", "jacobi")} == {k: shape[k] for k in ("method", "jacobi")}
    assert plan["batch_size"] == plan["batch"]["best_batch"] == 2 and plan["batch_from"] == "measured" and plan["batch"]["kv_bytes_per_row"] > 0
    assert read_manifest(second.output)["config"]["pool"]["batch_size"] == "auto"
