"""ViSpec draft training pipeline on a tiny LLaVA: data generation (Ray Data), losses, the
training sequence = the inference sequence, Ray Train 1 vs 2 workers, and a trained draft that
decodes through ``caption_images``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from raydec.reference.shapes import sample_images
from raydec.train.config import DataGenConfig, DraftTrainConfig, LossConfig
from raydec.train.losses import listmle_topk, prob_l1, vispec_loss
from tests.vlm_toys import build_tiny_llava

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NEW_TOKENS = 10
IMAGE_TOKENS = 64


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny_llava"))


@pytest.fixture(scope="module")
def target(tiny_folder: Path):
    from raydec.api import load_target

    torch.set_num_threads(1)
    return load_target(str(tiny_folder), task="caption")


@pytest.fixture(scope="module")
def dataset(ray_cluster, tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from raydec.train.datagen import generate_dataset

    out = tmp_path_factory.mktemp("draft_data")
    config = DataGenConfig(
        target=str(tiny_folder), output_dir=out, num_samples=6, max_new_tokens=NEW_TOKENS, batch_size=3,
        workers=2, cpus_per_worker=0.5, storage_dtype="float32",
    )
    generate_dataset(config, sample_images)
    return out


def _train_config(data: Path, out: Path, workers: int, **overrides) -> DraftTrainConfig:
    values = dict(
        name=f"tiny-{workers}w", data_dir=data, output_dir=out, work_dir=out.parent / "_ray", steps=6, batch_size=4,
        lr=3e-3, warmup_steps=1, mtp_steps=1, feature_noise=0.2, num_workers=workers, cpus_per_worker=0.5, seed=3,
        log_every=2,
    )
    values.update(overrides)
    return DraftTrainConfig(**values)


# -- data generation -------------------------------------------------------------------------


def test_data_shards_shapes_and_loss_masks(dataset: Path, target) -> None:
    from raydec.train.dataset import load_samples

    manifest = json.loads((dataset / "manifest.json").read_text())
    assert manifest["num_samples"] == 6 and manifest["seeds"] == [0, 6] and manifest["shards"]
    samples = load_samples(dataset)
    assert [s.seed for s in samples] == list(range(6))
    hidden_size = target.hidden_size
    for s in samples:
        length = s.length
        assert s.embeds.shape == s.hidden.shape == (length, hidden_size)
        assert s.image_index.shape == s.loss_mask.shape == (length,)
        assert int((s.image_index == 0).sum()) == IMAGE_TOKENS and int((s.image_index > 0).sum()) == 0
        generated = length - s.prompt_len
        assert 1 <= generated <= NEW_TOKENS
        assert s.loss_mask[s.prompt_len :].all() and not s.loss_mask[: s.prompt_len].any()
        # answer embeddings are the token table's; the answer is the target's greedy continuation
        answer = s.input_ids[s.prompt_len :]
        assert torch.allclose(s.embeds[s.prompt_len :], target.embed_prompt_tokens(answer).float(), atol=1e-6)
        greedy = target.head(s.hidden[s.prompt_len - 1 : -1]).argmax(-1)
        assert torch.equal(greedy, answer)
    assert manifest["num_generated_tokens"] == sum(s.length - s.prompt_len for s in samples)


def test_dataset_is_reused_only_with_the_same_content(dataset: Path, tiny_folder: Path) -> None:
    from raydec.train.datagen import generate_dataset

    same = DataGenConfig(target=str(tiny_folder), output_dir=dataset, num_samples=6, max_new_tokens=NEW_TOKENS,
                         batch_size=2, workers=1, storage_dtype="float32")
    assert generate_dataset(same, sample_images)["num_samples"] == 6  # other batch / worker settings: same content
    with pytest.raises(FileExistsError, match="other settings or target weights"):
        generate_dataset(same.model_copy(update={"num_samples": 5}), sample_images)


def test_reuse_reads_a_manifest_from_before_temperatures_as_greedy(dataset: Path, tiny_folder: Path, tmp_path: Path) -> None:
    import shutil

    from raydec.train.datagen import generate_dataset

    old = tmp_path / "old"
    shutil.copytree(dataset, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["identity"]["temperatures"]  # written before the field existed: greedy answers
    (old / "manifest.json").write_text(json.dumps(manifest))
    greedy = DataGenConfig(target=str(tiny_folder), output_dir=old, num_samples=6, max_new_tokens=NEW_TOKENS, storage_dtype="float32")
    assert generate_dataset(greedy, sample_images)["num_samples"] == 6
    with pytest.raises(FileExistsError, match="other settings or target weights"):
        generate_dataset(greedy.model_copy(update={"temperatures": [0.0, 1.0]}), sample_images)


def test_sampled_answers_follow_their_seed_and_temperature(target) -> None:
    """temperatures=[0, 1]: even seeds greedy, odd seeds sampled from a generator of their own seed,
    whatever the batch they are captioned in."""
    from raydec.api import caption_images
    from raydec.config import DecodeConfig, SamplingConfig
    from raydec.reference.shapes import make_sample, to_pil
    from raydec.train.datagen import caption_seeds

    config = DataGenConfig(num_samples=8, max_new_tokens=NEW_TOKENS, batch_size=3, temperatures=[0.0, 1.0])
    assert [config.temperature_of(s) for s in range(4)] == [0.0, 1.0, 0.0, 1.0]
    images = [to_pil(make_sample(s).image) for s in range(8)]
    mixed = [r.tokens for r in caption_seeds(target, list(range(8)), images, config)]
    assert [r.tokens for r in caption_seeds(target, [5, 2, 7], [images[5], images[2], images[7]], config)] == [mixed[5], mixed[2], mixed[7]]
    for temperature, seeds in ((0.0, [0, 2, 4, 6]), (1.0, [1, 3, 5, 7])):
        decode = DecodeConfig(method="ar", max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(temperature=temperature))
        alone = caption_images([to_pil(make_sample(s).image) for s in seeds], prompt=config.prompt, model=target, decode=decode, seeds=seeds)
        assert [r.tokens for r in alone] == [mixed[s] for s in seeds]
    greedy = [r.tokens for r in caption_seeds(target, [1, 3, 5, 7], [images[s] for s in (1, 3, 5, 7)],
                                              config.model_copy(update={"temperatures": [0.0]}))]
    assert greedy != [mixed[s] for s in (1, 3, 5, 7)]  # the sampled answers are not the greedy ones
    with pytest.raises(ValueError, match=r"temperatures\[1\]: -0.5 must be in \[0, 10\]"):
        DataGenConfig(temperatures=[0.0, -0.5])


def test_a_local_target_folder_is_recorded_absolute(tmp_path: Path, monkeypatch) -> None:
    # Ray Train workers run in their own folder: a relative target would not be found there
    monkeypatch.chdir(tmp_path)
    assert DataGenConfig(target="out/vlm").target == "out/vlm"  # no such folder: a hub id, kept as named
    (tmp_path / "out" / "vlm").mkdir(parents=True)
    assert DataGenConfig(target="out/vlm").target == str(tmp_path / "out" / "vlm")
    assert DraftTrainConfig(target="vlm").target == str(tmp_path / "vlm")
    assert DataGenConfig().target == "reference" and DraftTrainConfig().target is None


# -- losses ----------------------------------------------------------------------------------


def test_l1_term_on_hand_made_tensors() -> None:
    target_probs = torch.tensor([[1.0, 0.0], [0.25, 0.75]])
    uniform = torch.zeros(2, 2)
    assert torch.allclose(prob_l1(uniform, target_probs), torch.tensor([1.0, 0.5]))
    exact = target_probs.clamp(min=1e-12).log()
    assert float(prob_l1(exact, target_probs).max()) < 1e-6
    config = LossConfig(listmle_weight=0.0)
    assert torch.allclose(vispec_loss(uniform, target_probs, config), 10 * torch.tensor([1.0, 0.5]))


def test_listmle_prefers_the_target_order() -> None:
    vocab = 32
    target_probs = torch.softmax(torch.linspace(3.0, -3.0, vocab), dim=-1)  # token 0 most likely
    ordered = torch.linspace(5.0, -5.0, vocab)
    reversed_top = ordered.clone()
    reversed_top[:10] = ordered[:10].flip(0)  # same top-10 set, reversed order
    assert float(listmle_topk(ordered, target_probs)) < float(listmle_topk(reversed_top, target_probs))
    assert float(listmle_topk(ordered, target_probs)) < float(listmle_topk(-ordered, target_probs))
    # closed form for k = 1: -log softmax(z)[top token]
    z = torch.randn(vocab)
    assert torch.allclose(listmle_topk(z, target_probs, k=1), -torch.log_softmax(z, -1)[0], atol=1e-5)


def test_learning_rate_schedule_ends_on_time_when_asked() -> None:
    from raydec.train.trainer import learning_rate

    config = DraftTrainConfig(steps=1000, warmup_steps=10, lr=1.0, min_lr_ratio=0.1, max_minutes=10, anneal_on_time=True)
    assert learning_rate(0, config) == pytest.approx(0.1)  # warm-up
    assert learning_rate(20, config, time_fraction=0.0) > 0.99
    assert learning_rate(20, config, time_fraction=0.5) == pytest.approx(0.55)
    assert learning_rate(20, config, time_fraction=1.0) == pytest.approx(0.1)
    assert learning_rate(1000, config) == pytest.approx(0.1)


# -- training sequence = inference sequence ---------------------------------------------------


def test_training_pairs_match_the_proposer(dataset: Path, target) -> None:
    """The draft's hidden state at the root after the proposer's prefill equals the training
    forward's output at pair L-1 (same sequence, compressed image, global feature, positions)."""
    from raydec.config import DecodeConfig, SamplingConfig
    from raydec.models.hf_vlm import VlmPrompt
    from raydec.reference.shapes import make_sample, to_pil
    from raydec.speculative.engine import Engine
    from raydec.speculative.requests import RowRequest
    from raydec.speculative.proposers.draft_tree import DraftTreeProposer
    from raydec.train.dataset import load_samples
    from raydec.train.step import build_pairs
    from raydec.train.trainer import _frozen_head, build_draft_model

    config = _train_config(dataset, dataset / "unused", 1, feature_noise=0.0, num_q=3)
    draft_model = build_draft_model(target.text_config, _frozen_head(target, torch.device("cpu")), config)
    draft_model.attach_target(target.model.get_input_embeddings(), target.head)
    with torch.no_grad():  # a non-trivial global feature path
        draft_model.img_fc.weight.add_(0.05 * torch.randn_like(draft_model.img_fc.weight))
    draft_model.eval()
    sample = load_samples(dataset)[1]
    with torch.no_grad():
        pairs = build_pairs(draft_model, [sample], 0, config, torch.device("cpu"))
        hidden = draft_model(pairs.token_embeds, pairs.features, pairs.positions, pairs.attention_mask(), None, pairs.globals_, pairs.use_global)
    at = int((pairs.positions[0] == sample.prompt_len - 1).nonzero())

    captured = {}

    class Recording(DraftTreeProposer):
        def start(self, state, first_probs, prefill):
            super().start(state, first_probs, prefill)
            captured.setdefault("root", self.root_hidden.clone())

    image = to_pil(make_sample(sample.seed).image)
    prompt = VlmPrompt(target.format_prompt("describe the image .", 1), [image])
    decode = DecodeConfig(method="vispec", max_new_tokens=2, sampling=SamplingConfig(temperature=0.0))
    Engine(target, Recording(draft_model), decode.sampling, decode.max_new_tokens, eos_token_ids=target.eos_token_ids).generate([RowRequest(prompt, seed=0)])
    assert torch.allclose(captured["root"][0], hidden[0, at], atol=1e-4)
    assert int(pairs.valid.sum()) == sample.length - 1 - IMAGE_TOKENS + (config.num_q - 1)


# -- Ray Train ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    """The same draft trained by one and by two Ray Train workers, the two runs at once (as a
    job's drafts train, their start-ups overlap)."""
    from concurrent.futures import ThreadPoolExecutor

    from raydec.train.trainer import train_draft_model

    root = tmp_path_factory.mktemp("drafts")
    with ThreadPoolExecutor(2) as pool:
        summaries = pool.map(lambda w: train_draft_model(_train_config(dataset, root / f"w{w}", w)), (1, 2))
        return dict(zip((1, 2), summaries))


def test_raydec_train_command_trains_a_draft(dataset: Path, tiny_folder: Path, tmp_path: Path, capsys, s3_config, s3_bucket,
                                            monkeypatch) -> None:
    """`raydec train --config` on the module's tiny VLM: its data (same settings) is reused, one draft trains
    and is published to a bucket, from where it resolves as a draft model."""
    import yaml

    from raydec.cli import main

    data = DataGenConfig(target=str(tiny_folder), output_dir=dataset, num_samples=6, max_new_tokens=NEW_TOKENS, batch_size=3,
                         workers=2, cpus_per_worker=0.5, storage_dtype="float32")
    draft_model = _train_config(dataset, tmp_path / "eagle", 1, name="eagle", vision=False, steps=2, data_dir=None,
                                publish_to=f"s3://{s3_bucket}/drafts/eagle")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_config.endpoint_url)
    config = tmp_path / "draft.yaml"
    config.write_text(yaml.safe_dump({"data": data.model_dump(mode="json"), "draft_models": [draft_model.model_dump(mode="json")]}))
    generated = (dataset / "manifest.json").stat().st_mtime_ns
    assert main(["train", "--config", str(config)]) == 0
    assert (dataset / "manifest.json").stat().st_mtime_ns == generated  # the data was reused, not generated again
    assert {"draft_config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "eagle").iterdir()}
    assert '"steps"' in capsys.readouterr().out  # the job's result, printed as JSON
    from raydec.models.sources import model_folder

    published = model_folder(f"s3://{s3_bucket}/drafts/eagle", s3=s3_config)
    assert (published / "model.safetensors").read_bytes() == (tmp_path / "eagle" / "model.safetensors").read_bytes()


def test_two_workers_match_one_worker(trained: dict[int, dict]) -> None:
    one, two = (json.loads((Path(trained[w]["output_dir"]) / "train_log.json").read_text())["steps"] for w in (1, 2))
    assert len(one) == len(two) == 6
    assert one[-1]["loss"] < one[0]["loss"]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) <= 0.05 * abs(a["loss"]), (a, b)
    for w in (1, 2):
        folder = Path(trained[w]["output_dir"])
        assert {"draft_config.json", "model.safetensors", "loss_curve.png"} <= {p.name for p in folder.iterdir()}


def test_trained_draft_loads_and_decodes(trained: dict[int, dict], target) -> None:
    from raydec.api import caption_images
    from raydec.config import DecodeConfig, SamplingConfig
    from raydec.models.vispec_draft import VispecDraft
    from raydec.reference.shapes import make_sample, to_pil

    path = trained[2]["output_dir"]
    draft = VispecDraft.from_pretrained(path, target=target)
    assert draft.config.vision and draft.lm_head is target.head
    assert "lm_head.weight" not in draft.state_dict()
    images = [to_pil(make_sample(1_000_000 + i).image) for i in range(3)]
    greedy = SamplingConfig(temperature=0.0)
    ar = caption_images(images, model=target, decode=DecodeConfig(method="ar", max_new_tokens=8, sampling=greedy))
    spec = caption_images(
        images, model=target, decode=DecodeConfig(method="vispec", draft_model=str(path), max_new_tokens=8, sampling=greedy)
    )
    assert [r.tokens for r in spec] == [r.tokens for r in ar]


# -- bad configs and inputs fail by name, before any data generation or training -------------


def test_train_configs_refuse_nonsense_by_name(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from raydec.train.config import DraftTrainingConfig, EvalConfig

    for betas, message in (((1.5, 0.9), r"betas\[0\]: 1.5 must be a number in \[0, 1\)"),
                           ((True, 0.9), r"betas\[0\]: True must be a number"),
                           ((0.9, -0.1), r"betas\[1\]: -0.1")):
        with pytest.raises(ValidationError, match=message):
            DraftTrainConfig(betas=betas)
    with pytest.raises(ValidationError, match="draft_models"):
        DraftTrainingConfig(draft_models=[])
    same_folder = [DraftTrainConfig(name="a", output_dir=tmp_path / "x"), DraftTrainConfig(name="b", output_dir=tmp_path / "x")]
    with pytest.raises(ValidationError, match=r"draft_models\[1\].output_dir: .* is another draft model's too"):
        DraftTrainingConfig(draft_models=same_folder)
    two_vispec = [DraftTrainConfig(name="a", output_dir=tmp_path / "a"), DraftTrainConfig(name="b", output_dir=tmp_path / "b")]
    assert DraftTrainingConfig(draft_models=two_vispec)  # fine to train, but not to evaluate: one draft model per method
    with pytest.raises(ValidationError, match=r"draft_models\[1\]: a second vispec draft model"):
        DraftTrainingConfig(draft_models=two_vispec, evaluate=EvalConfig())
    with pytest.warns(FutureWarning, match="'drafts' is now 'draft_models'"):  # the key of earlier releases still loads
        assert DraftTrainingConfig.model_validate({"drafts": two_vispec}).draft_models == two_vispec


ROOT = Path(__file__).resolve().parents[2]
REFERENCE_JOB = ROOT / "jobs" / "configs" / "train_vispec_reference.yaml"


def _train_job_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_vispec_job", ROOT / "jobs" / "train_vispec.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def test_job_overrides_are_validated_like_the_file(capsys) -> None:
    job = _train_job_module()
    for flag in (["--steps", "0"], ["--samples", "-5"]):
        with pytest.raises(SystemExit):
            job.main(["--config", str(REFERENCE_JOB), *flag])
        assert "bad override" in capsys.readouterr().err


def test_train_job_refuses_a_bad_file_or_target_in_one_line_before_ray(capsys, tmp_path: Path) -> None:
    import yaml

    job = _train_job_module()
    values = yaml.safe_load(REFERENCE_JOB.read_text())
    values["data"]["output_dir"] = str(tmp_path / "data")
    for index, draft_model in enumerate(values["draft_models"]):
        draft_model["output_dir"] = str(tmp_path / f"draft{index}")
    cases = {
        "unknown": ({**values, "draft_models": [{**values["draft_models"][0], "lrr": 0.1}, *values["draft_models"][1:]]},
                    r"draft_models\.0\.lrr: Extra inputs are not permitted"),
        "no_target": ({**values, "data": {**values["data"], "target": str(tmp_path / "nowhere")}}, r"data\.target: .*nowhere.*config\.json not found"),
    }
    for name, (config, message) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        with pytest.raises(SystemExit) as exited:
            job.main(["--config", str(path)])
        assert re.search(message, str(exited.value)), str(exited.value)
    assert not (tmp_path / "data").exists()


def test_draft_inputs_are_checked_before_ray_starts(dataset: Path, tiny_folder: Path, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    from raydec.train.datagen import read_manifest
    from raydec.train.trainer import check_training_inputs

    config = _train_config(dataset, tmp_path / "draft", 1)
    assert check_training_inputs(config) == str(tiny_folder)
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(NotADirectoryError, match=r"output_dir: .*a_file' is a file"):
        check_training_inputs(config.model_copy(update={"output_dir": a_file / "draft"}))
    wider = build_tiny_llava(tmp_path / "wider")
    config_json = json.loads((wider / "config.json").read_text())
    config_json["text_config"]["hidden_size"] = 96
    (wider / "config.json").write_text(json.dumps(config_json))
    with pytest.raises(ValueError, match="has hidden_size 96, the data .* hidden_size 64"):
        check_training_inputs(config.model_copy(update={"target": str(wider)}))
    retrained = tmp_path / "retrained"
    shutil.copytree(tiny_folder, retrained)
    weights = load_file(str(retrained / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name] + 1.0
    save_file(weights, str(retrained / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="made by other target weights"):
        check_training_inputs(config.model_copy(update={"target": str(retrained)}))
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"config": {}, "counts": {}}))  # e.g. a batch job's output
    with pytest.raises(ValueError, match="is not a raydec draft dataset"):
        read_manifest(other)


def test_model_card_snippet_names_the_draft_it_describes(tmp_path: Path) -> None:
    from raydec.models.registry import REFERENCE_DRAFT_DIRS, REFERENCE_VLM_DIR
    from raydec.train.card import _usage

    assert _usage(str(REFERENCE_VLM_DIR), "vispec", REFERENCE_DRAFT_DIRS["vispec"]) == (
        "reference", "the reference LLaVA (`raydec/reference/weights/vlm`)", "")
    model, _, draft = _usage(str(REFERENCE_VLM_DIR), "eagle", tmp_path / "eagle")
    assert model == "reference" and draft == f", draft_model={str(tmp_path / 'eagle')!r}"
    model, name, draft = _usage("/models/my-llava", "vispec", tmp_path / "v")
    assert model == "/models/my-llava" and "my-llava" in name and "draft_model" in draft


def test_model_card_objective_names_the_losses_the_steps_used() -> None:
    from raydec.train.card import _objective

    stage2 = _objective(DraftTrainConfig(steps=100, mtp_steps=3))
    assert stage2.startswith("stage 2: 10·L1") and "stage 1" not in stage2 and "self-rollout mtp_steps=3" in stage2
    both = _objective(DraftTrainConfig(steps=100, stage1_steps=40, mtp_steps=2))
    assert both.startswith("stage 1 (EAGLE): 1·SmoothL1(feature) + 0.1·(CE + 0.1·ListMLE_top10) for the first 40 steps, then stage 2")
    # the published EAGLE-2 recipe: stage 1 on every step, no rollout
    eagle2 = _objective(DraftTrainConfig(steps=100, stage1_steps=100, mtp_steps=0))
    assert "every step (no stage 2)" in eagle2 and "L1(softmax" not in eagle2 and "no self-rollout" in eagle2
