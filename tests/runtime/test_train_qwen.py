"""ViSpec and EAGLE drafts for the M-RoPE families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): tiny random
checkpoints of the real classes, saved and loaded by path; draft data from the target's own
multimodal positions (the Ray Data job), drafts trained, then decoding with the trained drafts.
One family goes through ``raydec train --config`` end to end (Ray Train workers); the other two
run the same job's steps from this process: the data job, then ``train_draft_model_in_process`` (the
training loop of a one-worker run, without Ray Train's start-up).

Per family: the stored hidden states are the target's own (Hugging Face's forward over prompt
and answer, Qwen3-VL's DeepStack features included); both drafts decode exactly AR's and
Hugging Face ``generate``'s greedy tokens at batch 1 and 3; ViSpec's samples at T=1 follow the
target's exact law; the trained drafts commit more tokens per forward on their training images
than an untrained draft does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from raydec.config import DecodeConfig, DraftTreeConfig, SamplingConfig
from raydec.models.hf_vlm import VlmPrompt
from raydec.reference.shapes import make_sample, sample_images, to_pil
from tests.lawtest import compare_to_law, sample_engine
from tests.vlm_toys import build_tiny_qwen2_5_vl, build_tiny_qwen2_vl, build_tiny_qwen3_vl, hf_greedy_vlm, vlm_law

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BUILDERS = {"qwen2_vl": build_tiny_qwen2_vl, "qwen2_5_vl": build_tiny_qwen2_5_vl, "qwen3_vl": build_tiny_qwen3_vl}
PROMPT = "describe the image ."
NEW_TOKENS = 12
TRAIN_SEEDS = 24  # shapes-world seeds 0..23: the drafts' training images
GREEDY = SamplingConfig(temperature=0.0)


#: the family whose drafts train on a user's image dataset (Parquet on the moto S3 endpoint), not the shapes world;
#: its job runs as `raydec train --config` (Ray Train), the other families' in this process
S3_FAMILY = "qwen2_vl"


def _images_on_s3(endpoint: str) -> dict:
    """The training images (shapes-world seeds 0..TRAIN_SEEDS-1) as a user's Parquet dataset on S3:
    PNG bytes, ids, and a prompt column that names the prompt on even rows (null: the job's)."""
    import io
    import uuid

    import pyarrow as pa
    import pyarrow.parquet as pq

    from raydec.io.config import S3Config
    from raydec.io.filesystem import resolve_filesystem, s3_client

    s3 = S3Config(endpoint_url=endpoint, region="us-east-1", access_key_id="testing", secret_access_key="testing")
    bucket = f"images-{uuid.uuid4().hex[:8]}"
    s3_client(s3).create_bucket(Bucket=bucket)
    pngs = []
    for image in sample_images(list(range(TRAIN_SEEDS))):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        pngs.append(buffer.getvalue())
    table = pa.table({"id": [f"img-{i:03d}" for i in range(TRAIN_SEEDS)], "image": pngs,
                      "prompt": [PROMPT if i % 2 == 0 else None for i in range(TRAIN_SEEDS)]})
    fs, path = resolve_filesystem(f"s3://{bucket}/photos/part-0.parquet", s3)
    with fs.open_output_stream(path) as out:
        pq.write_table(table, out)
    return {"path": f"s3://{bucket}/photos/", "s3": {"endpoint_url": endpoint}}


def _train_job(name: str, root: Path, images: dict | None) -> tuple[Path, Path, dict[str, Path]]:
    """A tiny checkpoint of the family and the job file that trains its two drafts."""
    folder = BUILDERS[name](root / "target")
    drafts = {"vispec": root / "vispec", "eagle": root / "eagle"}
    train = dict(steps=40, batch_size=8, lr=3e-3, warmup_steps=5, mtp_steps=1, feature_noise=0.1, num_workers=1,
                 cpus_per_worker=0.5, log_every=20, seed=1)
    job = {
        "data": {"target": str(folder), "output_dir": str(root / "data"), "num_samples": TRAIN_SEEDS, "prompt": PROMPT,
                 "max_new_tokens": NEW_TOKENS, "batch_size": 12, "workers": 1, "cpus_per_worker": 0.5, "storage_dtype": "float32",
                 **({"images": images} if images else {})},
        "draft_models": [{"name": "vispec", "vision": True, "num_q": 2, "output_dir": str(drafts["vispec"]), **train},
                   {"name": "eagle", "vision": False, "output_dir": str(drafts["eagle"]), **train}],
        "parallel": True,
    }
    config = root / "train.yaml"
    config.write_text(yaml.safe_dump(job))
    return folder, config, drafts


def _train_in_process(config: Path) -> int:
    """The job's data (the Ray Data job ``raydec train`` runs), then its drafts trained here by
    ``train_draft_model_in_process``."""
    from raydec.reference.shapes import sample_images
    from raydec.train.config import DraftTrainingConfig
    from raydec.train.datagen import generate_dataset
    from raydec.train.run import preflight_draft_training
    from raydec.train.trainer import train_draft_model_in_process

    training = DraftTrainingConfig.from_yaml(config)
    draft_models = preflight_draft_training(training)
    generate_dataset(training.data, sample_images)
    for draft_model in draft_models:
        train_draft_model_in_process(draft_model)
    return 0


@pytest.fixture(scope="module")
def trained_families(ray_cluster, moto_server, tmp_path_factory) -> dict[str, dict]:
    """The three families' jobs, run at once: S3_FAMILY's as ``raydec train`` (Ray Train), the
    others' from this process."""
    from concurrent.futures import ThreadPoolExecutor

    from raydec.api import load_target
    from raydec.cli import main

    images = _images_on_s3(moto_server)
    jobs = {name: _train_job(name, tmp_path_factory.mktemp(name), images if name == S3_FAMILY else None) for name in BUILDERS}

    def run(name: str) -> int:
        config = jobs[name][1]
        return main(["train", "--config", str(config)]) if name == S3_FAMILY else _train_in_process(config)

    with ThreadPoolExecutor(len(jobs)) as pool:
        codes = dict(zip(jobs, pool.map(run, jobs)))
    assert codes == {name: 0 for name in jobs}
    assert (jobs[S3_FAMILY][2]["vispec"].parent / "_ray_train").is_dir()  # its drafts trained on Ray Train workers
    torch.set_num_threads(1)
    return {name: {"name": name, "folder": folder, "target": load_target(str(folder), task="caption"), "drafts": drafts,
                   "data": config.parent / "data", "images": images if name == S3_FAMILY else None}
            for name, (folder, config, drafts) in jobs.items()}


@pytest.fixture(params=sorted(BUILDERS))
def family(request, trained_families) -> dict:
    return trained_families[request.param]


def _prompts(target, seeds: list[int]) -> list[VlmPrompt]:
    return [VlmPrompt(target.format_prompt(PROMPT, 1), [to_pil(make_sample(s).image)]) for s in seeds]


def test_draft_data_holds_the_targets_own_hidden_states(family) -> None:
    """sample_tensors over prompt + answer (M-RoPE for the prompt, text positions after it)
    equals Hugging Face's own forward over the same ids."""
    from raydec.train.datagen import sample_tensors

    target = family["target"]
    (prompt,) = _prompts(target, [3])
    answer = [target.processor.tokenizer.convert_tokens_to_ids(w) for w in ("the", "image", "of", "a")]
    stored = sample_tensors(target, prompt, answer)
    inputs = dict(target.processor(text=[prompt.text], images=list(prompt.images), return_tensors="pt"))
    inputs["input_ids"] = torch.cat([inputs["input_ids"], torch.tensor([answer])], 1)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(answer), dtype=torch.long)], 1)
    with torch.no_grad():
        reference = target.model(**inputs, output_hidden_states=True).hidden_states[-1][0]
    assert torch.allclose(stored["hidden"], reference, atol=1e-5), (stored["hidden"] - reference).abs().max()


@pytest.mark.parametrize("method", ["vispec", "eagle"])
def test_trained_drafts_decode_ar_and_hf_generate_tokens_at_batch_1_and_3(family, method) -> None:
    from raydec.api import caption_images

    target = family["target"]
    seeds = [1_000_000 + i for i in range(3)]
    images = [to_pil(make_sample(s).image) for s in seeds]
    hf = [hf_greedy_vlm(target, p, NEW_TOKENS) for p in _prompts(target, seeds)]
    ar = DecodeConfig(method="ar", max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    spec = DecodeConfig(method=method, max_new_tokens=NEW_TOKENS, sampling=GREEDY, draft_model=str(family["drafts"][method]))
    for batch in (1, 3):
        rows = images[:batch]
        assert [r.tokens for r in caption_images(rows, PROMPT, target, spec, seeds[:batch])] == hf[:batch]
        assert [r.tokens for r in caption_images(rows, PROMPT, target, ar, seeds[:batch])] == hf[:batch]


@pytest.mark.slow
def test_vispec_samples_follow_the_targets_law_at_temperature_1(family) -> None:
    """2,500 rows (a budget: the suite's other law tests take 20,000), top-k 3 so the exact law
    over 3 tokens is enumerable from Hugging Face's forward."""
    from raydec.models.loading import load_draft_model
    from raydec.speculative.proposers.draft_tree import DraftTreeProposer

    target = family["target"]
    sampling = SamplingConfig(temperature=1.0, top_k=3)
    config = DecodeConfig(method="vispec", max_new_tokens=3, sampling=sampling, draft_tree=DraftTreeConfig(depth=3, top_k=3, total_tokens=8))
    draft_model = load_draft_model(target, "vispec", family["folder"], str(family["drafts"]["vispec"]))
    (prompt,) = _prompts(target, [5])
    samples = sample_engine(target, DraftTreeProposer(draft_model, config.tree), config, [prompt], list(range(2500)), 1250)
    report = compare_to_law(samples, vlm_law(target, prompt, 3, sampling))
    assert report.passed, str(report)


def test_trained_drafts_commit_more_per_forward_than_an_untrained_draft(family, tmp_path) -> None:
    """On training images: each trained draft's tokens per target forward beat an untrained draft's
    of the same shape (the same config, fresh weights)."""
    from raydec.api import caption_images
    from raydec.models.vispec_draft import VispecDraft

    target = family["target"]
    seeds = list(range(8))
    images = sample_images(seeds)

    def tokens_per_forward(method: str, path: Path) -> float:
        decode = DecodeConfig(method=method, max_new_tokens=NEW_TOKENS, sampling=GREEDY, draft_model=str(path))
        results = caption_images(images, PROMPT, target, decode, seeds)
        return sum(r.num_tokens for r in results) / sum(r.target_forwards for r in results)

    for method, path in family["drafts"].items():
        trained = VispecDraft.from_pretrained(path, target=target)
        torch.manual_seed(0)
        fresh = VispecDraft(trained.config)
        fresh.save_pretrained(tmp_path / method)
        before, after = tokens_per_forward(method, tmp_path / method), tokens_per_forward(method, path)
        print(f"{family['name']} {method}: untrained {before:.2f}, trained {after:.2f} tokens per forward")
        assert after > before + 0.3, (method, before, after)


def test_drafts_train_on_a_users_image_dataset_on_s3(trained_families) -> None:
    """One family's job read its images from a Parquet dataset on the moto S3 endpoint (Ray Data
    read tasks): every row became a sample, rows without a prompt were asked the job's, and the
    manifest names the dataset without the credentials that reached it."""
    import json

    import pyarrow.parquet as pq

    family = trained_families[S3_FAMILY]
    manifest = json.loads((family["data"] / "manifest.json").read_text())
    assert manifest["images"] == family["images"]["path"] and manifest["seeds"] is None
    assert manifest["num_samples"] == TRAIN_SEEDS
    assert "testing" not in json.dumps(manifest)  # the S3 keys resolved from the environment stay out
    rows = pq.read_table(family["data"] / "shards").to_pylist()
    question = family["target"].format_prompt(PROMPT, 1)
    assert len(rows) == TRAIN_SEEDS and all(r["length"] > r["prompt_len"] for r in rows)  # every row was answered
    image_token = family["target"].image_token_id
    asked = family["target"].processor(text=[question], images=sample_images([0]), return_tensors="pt")["input_ids"][0].tolist()
    after_image = asked[len(asked) - asked[::-1].index(image_token):]  # the question's ids after the image
    for row in rows:
        prompt = row["input_ids"][: row["prompt_len"]]
        assert prompt[len(prompt) - prompt[::-1].index(image_token):] == after_image
