"""The shipped reference text-to-image Janus: loads offline, runs HF's own image generate,
and its VQ tokenizer keeps the shapes readable by the judge."""

from __future__ import annotations

import os
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch

from raydec.reference.janus import model as jt
from raydec.reference.janus import pixels as px
from raydec.reference.load import REFERENCE_MODELS
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, words

WEIGHTS = REFERENCE_MODELS["t2i"].path

@pytest.fixture(scope="module")
def shipped():
    """(model, processor) loaded through the public ``load`` entry point."""
    torch.set_num_threads(1)
    from raydec.reference import load

    return load("t2i")


def test_shipped_folder_is_complete_and_small():
    names = {p.name for p in WEIGHTS.iterdir()}
    expected = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    expected |= {"processor_config.json", "MODEL_CARD.md", "loss_curve.png"}
    assert expected <= names
    total = sum(p.stat().st_size for p in WEIGHTS.rglob("*") if p.is_file())
    assert total <= 25 * 1024 * 1024, f"t2i weights are {total / 2**20:.1f} MiB"


def test_loads_with_real_classes_offline(shipped):
    from transformers import AutoProcessor, JanusForConditionalGeneration, JanusProcessor

    model, processor = shipped
    assert isinstance(model, JanusForConditionalGeneration) and not model.training
    assert isinstance(processor, JanusProcessor)
    assert isinstance(AutoProcessor.from_pretrained(WEIGHTS, local_files_only=True), JanusProcessor)
    config = model.config
    assert config.vision_config.num_image_tokens == jt.NUM_IMAGE_TOKENS == 256
    assert config.vq_config.num_patches == 16
    assert model.generation_config.guidance_scale and model.generation_config.guidance_scale > 1


def test_tokenizer_matches_shapes_words(shipped):
    _, processor = shipped
    tokenizer = processor.tokenizer
    prompt = make_sample(HELD_OUT_SEED_START + 7).prompt
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(prompt).input_ids)
    assert tokens == [jt.BOS_TOKEN] + words(prompt)
    ids = processor(text=[prompt], generation_mode="image", return_tensors="pt").input_ids[0]
    assert ids[0].item() == tokenizer.bos_token_id
    assert ids[-1].item() == tokenizer.convert_tokens_to_ids(jt.BOI_TOKEN)
    assert tokenizer.unk_token_id not in ids.tolist()


def test_hf_generate_image_mode_runs_and_decodes(shipped):
    model, processor = shipped
    prompts = [make_sample(HELD_OUT_SEED_START + i).prompt for i in range(2)]
    inputs = processor(text=prompts, generation_mode="image", padding=True, return_tensors="pt")
    torch.manual_seed(0)
    with torch.no_grad():
        ids = model.generate(**inputs, generation_mode="image")
        pixels = model.decode_image_tokens(ids)
    assert ids.shape == (2, 256)
    assert int(ids.min()) >= 0 and int(ids.max()) < model.config.vq_config.num_embeddings
    assert pixels.shape == (2, 64, 64, 3) and torch.isfinite(pixels).all()
    images = processor.postprocess(list(pixels.permute(0, 3, 1, 2).float()), return_tensors="PIL.Image.Image")
    assert images["pixel_values"][0].size == (64, 64)


def test_hf_generate_samples_score_at_least_0_8(shipped):
    """Hugging Face's own sampler on 20 held-out prompts, scored by the judge: at least 0.8.
    Measured 0.874 with this seed (seeds 1-3: 0.861 / 0.870 / 0.827; 0.868 on 200 prompts,
    MODEL_CARD.md; the iid weights before them: 0.834, 0.831); an untrained or wrongly loaded
    model scores ~0.2."""
    from raydec.reference.janus.evaluate import decode_images, generate_image_tokens, held_out_prompts
    from raydec.reference.judge import score_image

    model, processor = shipped
    prompts = held_out_prompts(20)
    images = decode_images(model, generate_image_tokens(model, processor, prompts, seed=0))
    assert np.mean([score_image(image, prompt) for image, prompt in zip(images, prompts)]) >= 0.8


def test_attribute_accuracy_by_kind_pairs_objects_by_cell():
    from raydec.reference.janus.evaluate import attribute_accuracy_by_kind

    samples = [make_sample(HELD_OUT_SEED_START + i) for i in range(6)]
    truth = attribute_accuracy_by_kind([s.image for s in samples], [s.prompt for s in samples])
    assert truth == {"drawn": 1.0, "colour": 1.0, "shape": 1.0, "fill": 1.0, "size": 1.0}
    shuffled = attribute_accuracy_by_kind([s.image for s in samples], [s.prompt for s in samples[1:] + samples[:1]])
    assert shuffled["drawn"] < 1.0


def test_unconditional_rows_match_generate_layout(shipped):
    _, processor = shipped
    tokenizer = processor.tokenizer
    inputs = processor(text=["a small red circle top", "a large blue square"], generation_mode="image", padding=True)
    ids = torch.as_tensor(inputs["input_ids"])
    boi = tokenizer.convert_tokens_to_ids(jt.BOI_TOKEN)
    uncond = jt.unconditional_ids(ids, tokenizer.bos_token_id, boi, tokenizer.pad_token_id)
    # HF Janus generate: every token that is neither BOS nor BOI becomes pad.
    expected = ids.clone()
    expected[(ids != tokenizer.bos_token_id) & (ids != boi)] = tokenizer.pad_token_id
    assert torch.equal(uncond, expected)


def _round_trip(model, count: int = 500, texture: str = "iid") -> tuple[list, np.ndarray]:
    """Ground-truth samples of held-out seeds (the judge test's 500) and their VQ round trips (uint8)."""
    samples = [make_sample(HELD_OUT_SEED_START + i, texture=texture) for i in range(count)]
    pixels = px.images_to_pixels(torch.from_numpy(np.stack([s.image for s in samples])))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # convolutions over whole images: unlike the suite's tiny decode tensors, threads pay
    try:
        with torch.no_grad():
            chunks = []
            for chunk in pixels.split(25):  # small batches stay in cache: 2x faster than one of 500
                chunks.append(model.model.vqmodel.decode(px.vq_encode(model.model.vqmodel, chunk)))
        decoded = px.pixels_to_images(torch.cat(chunks)).numpy()
    finally:
        torch.set_num_threads(threads)
    return samples, decoded


def test_stock_vq_paths_equal_the_training_forwards(shipped):
    """What the VQ was trained through is what Hugging Face runs: stock ``decode`` of ids
    equals the training decoder path, and ``vq_encode`` is the argmax of the trained logits."""
    model, _ = shipped
    vq = model.model.vqmodel
    pixels = px.images_to_pixels(torch.from_numpy(np.stack([make_sample(HELD_OUT_SEED_START + i).image for i in range(4)])))
    with torch.no_grad():
        ids = px.vq_encode(vq, pixels)  # [B, N]
        assert torch.equal(ids, px.code_logits(vq, pixels, 1.0).argmax(dim=1).flatten(1))
        side = int(ids.shape[1] ** 0.5)
        assert torch.allclose(vq.decode(ids), px.decode_codes(vq, ids.view(-1, side, side)), atol=1e-4)


@pytest.mark.parametrize("texture", ["iid", "runs"])
def test_vq_round_trip_keeps_judge_accuracy(shipped, texture):
    """>= 0.9 judge accuracy after encode -> decode on the judge test's 500 images
    (measured 0.948 iid, 0.946 runs: one VQ-VAE serves both textures)."""
    from raydec.reference.judge import score_image

    model, _ = shipped
    samples, decoded = _round_trip(model, texture=texture)
    truth = np.mean([score_image(s.image, s.prompt) for s in samples])
    round_trip = np.mean([score_image(img, s.prompt) for img, s in zip(decoded, samples)])
    assert truth >= 0.95 and round_trip >= 0.9, (truth, round_trip)


def test_object_token_mask_covers_exactly_the_object_boxes():
    """The LM loss weighs the tokens of each stated object's box; read from the prompt alone,
    they must be the boxes the renderer drew."""
    from raydec.reference.janus.lm import object_token_mask
    from raydec.reference.shapes import GRID_BLOCKS, object_box

    for seed in range(40):
        sample = make_sample(seed)
        boxes = np.zeros((GRID_BLOCKS, GRID_BLOCKS), dtype=bool)
        for obj in sample.objects:
            x0, y0, side = (v // 4 for v in object_box(obj.position, obj.size))
            boxes[y0 : y0 + side, x0 : x0 + side] = True
        mask = object_token_mask(sample.prompt)
        assert mask.shape == (256,) and np.array_equal(mask, boxes.reshape(-1)), sample.prompt
        assert mask.sum() == sum(16 if o.size == "large" else 4 for o in sample.objects)


def test_attribute_probe_targets_name_each_box_object():
    """The training-only probe must name, at every token of a box, that box's object."""
    from raydec.reference.janus.lm import IGNORE, object_attribute_targets, object_token_mask
    from raydec.reference.shapes import COLORS, FILLS, SHAPES, object_box

    for seed in range(40):
        sample = make_sample(seed)
        targets = object_attribute_targets(sample.prompt).reshape(3, 16, 16)
        assert np.array_equal(targets[0].reshape(-1) != IGNORE, object_token_mask(sample.prompt))
        for obj in sample.objects:
            x0, y0, side = (v // 4 for v in object_box(obj.position, obj.size))
            box = targets[:, y0 : y0 + side, x0 : x0 + side]
            assert (box[0] == list(COLORS).index(obj.color)).all(), sample.prompt
            assert (box[1] == SHAPES.index(obj.shape)).all() and (box[2] == FILLS.index(obj.fill)).all()


def test_attribute_loss_ignores_unlabelled_tokens_and_rewards_the_right_names():
    from raydec.reference.janus.lm import ATTRIBUTE_CLASSES, IGNORE, attribute_loss

    probe = torch.nn.Identity()
    targets = torch.full((1, 3, 2), IGNORE)
    targets[0, :, 0] = torch.tensor([2, 1, 0])  # token 0: colour 2, shape 1, fill 0; token 1: no object
    right = torch.zeros(1, 2, sum(ATTRIBUTE_CLASSES))
    offsets = [0, ATTRIBUTE_CLASSES[0], ATTRIBUTE_CLASSES[0] + ATTRIBUTE_CLASSES[1]]
    for k, value in enumerate((2, 1, 0)):
        right[0, 0, offsets[k] + value] = 20.0
    wrong = right.clone()
    wrong[0, 0] = right[0, 0].roll(1)
    right[0, 1] = torch.randn(sum(ATTRIBUTE_CLASSES)) * 50  # an unlabelled token changes nothing
    assert attribute_loss(probe, right, targets) < 1e-6
    assert attribute_loss(probe, wrong, targets) > 10.0


def test_lm_checkpoint_without_the_probe_resumes_with_a_fresh_one(tmp_path):
    from raydec.reference.janus.checkpoint import load_checkpoint, save_checkpoint

    model, probe = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path / "ckpt.pt", 7, {"model": model}, [{"step": 6, "loss": 1.0}], {"seconds": 2.0})
    fresh = probe.weight.detach().clone()
    restored = torch.nn.Linear(3, 3)
    step, losses, extra = load_checkpoint(tmp_path / "ckpt.pt", {"model": restored, "probe": probe}, ("probe",))
    assert step == 7 and extra == {"seconds": 2.0} and torch.equal(restored.weight, model.weight)
    assert torch.equal(probe.weight, fresh)
    with pytest.raises(KeyError):
        load_checkpoint(tmp_path / "ckpt.pt", {"model": restored, "probe": probe})


def test_word_sensitivity_sees_the_words_the_model_reads(shipped):
    from raydec.reference.janus.evaluate import replace_words, word_sensitivity

    assert replace_words("a large purple speckled diamond top right", "colour") == "a large red speckled diamond top right"
    assert replace_words("a small red solid cross left", "size") == "a large red solid cross left"
    model, processor = shipped
    result = word_sensitivity(model, processor, num_images=4)
    assert set(result) == {"colour", "shape", "fill", "size"}
    assert all(r["kl_mean"] >= 0 and r["kl_max"] >= r["kl_mean_objects"] for r in result.values())
    assert result["size"]["kl_max"] > 1.0, "size words decide where a box starts; the probe must see that"


def test_train_cli_dispatches_by_subcommand():
    from raydec.reference import train

    assert {"t2i", "vlm"} <= set(train.SUBCOMMANDS)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["no-such-model"])
    assert exit_info.value.code == 2


def test_neighbour_copies_are_the_prior_the_reference_shapes_want(shipped):
    """Flat regions and runs textures repeat codes along rows (and flat ones down columns):
    copying a neighbour as the fresh draft needs far fewer forwards than a uniform guess, and
    the tuner sees it. (Which neighbour wins varies by image: on these two, above by 2 forwards;
    on the bench's calibration prompts, left by 26.)"""
    from raydec.api import load_target
    from raydec.config import JacobiDraftConfig
    from raydec.bench.cost_tuner import choose_fresh_drafts

    target = load_target("reference", "t2i", dtype=torch.float32)
    prompts = [make_sample(HELD_OUT_SEED_START + 900 + i).prompt for i in range(2)]
    chosen, steps = choose_fresh_drafts(target, "sjd", JacobiDraftConfig(window=16), prompts, [0, 1], target.default_sampling())
    assert chosen in ("left", "above") and steps[chosen] == min(steps.values()), steps
    assert steps[chosen] < 0.75 * steps["uniform"], steps


def test_continuing_refuses_another_tokenisation_and_bad_folders(shipped, tmp_path):
    """``init_from`` keeps the shipped VQ-VAE, so the block codes must be the ones it learned:
    a k-means fitted on too few images is another tokenisation and is refused by name."""
    from raydec.reference.janus.codes import BlockCodes, block_codes
    from raydec.reference.janus.settings import T2ISettings
    from raydec.reference.janus.train import check_tokenisation, train_t2i

    model, _ = shipped
    images = np.stack([make_sample(seed).image for seed in range(8)])  # training seeds
    pixels = px.images_to_pixels(torch.from_numpy(images))
    own_ids = px.vq_encode(model.model.vqmodel, pixels).numpy()
    centroids = torch.zeros(512, 48)
    assert check_tokenisation(model, images, BlockCodes(centroids, own_ids)) == 1.0
    settings = T2ISettings(work_dir=tmp_path, num_images=8, vq_kmeans_images=8, vq_kmeans_iterations=1, texture="runs")
    other = block_codes(images, 512, settings)
    with pytest.raises(ValueError, match="init_from model's VQ encoder agrees with the block codes on 0"):
        check_tokenisation(model, images, other)
    with pytest.raises(ValueError, match="init_from='/nonexistent'"):
        train_t2i(T2ISettings(work_dir=tmp_path, init_from="/nonexistent", num_images=8), stages=("lm",))
    with pytest.raises(ValueError, match="no vq stage"):
        train_t2i(T2ISettings(work_dir=tmp_path, init_from=WEIGHTS), stages=("vq",))
    with pytest.raises(ValueError, match="texture"):
        train_t2i(T2ISettings(work_dir=tmp_path, texture="speckle"))


def test_default_recipe_trains_iid_then_continues_on_runs(tmp_path):
    """The shipped recipe end to end at toy size: phase one on "iid" images (VQ + LM) saved to
    ``work_dir/iid_model``; phase two continues that LM on "runs" images with the same block
    codes and saves the folder; ``resume`` then finds both phases done."""
    import json

    from transformers import JanusForConditionalGeneration

    from raydec.reference.janus.settings import T2ISettings
    from raydec.reference.janus.train import train_t2i

    settings = T2ISettings(
        out_dir=tmp_path / "out", work_dir=tmp_path / "work", num_images=8, vq_steps=2, vq_kmeans_images=8,
        vq_kmeans_iterations=1, lm_steps=2, lm_batch_size=2, texture_steps=2, checkpoint_every=1,
    )  # fmt: skip
    assert settings.texture == "runs" and settings.texture_steps > 0  # the shipped recipe's defaults
    out = train_t2i(settings)
    log = json.loads((out / "training_log.json").read_text())
    assert log["settings"]["texture"] == "runs" and log["lm_steps_done"] == 2 and log["vq_steps_done"] == 0
    assert log["settings"]["lm_lr"] == settings.texture_lr and log["settings"]["lm_attribute_from"] == 0
    assert log["init_from"]["settings"]["texture"] == "iid" and log["init_from"]["vq_steps_done"] == 2
    iid = JanusForConditionalGeneration.from_pretrained(settings.work_dir / "iid_model")
    runs = JanusForConditionalGeneration.from_pretrained(out)
    iid_state, runs_state = iid.state_dict(), runs.state_dict()
    assert all(torch.equal(v, runs_state[k]) for k, v in iid_state.items() if ".vqmodel." in k)  # VQ kept
    assert not torch.equal(iid_state["model.generation_head.vision_head.weight"], runs_state["model.generation_head.vision_head.weight"])
    codes = sorted(settings.work_dir.glob("block_codes_*.npz"))
    assert len(codes) == 2 and np.array_equal(np.load(codes[0])["centroids"], np.load(codes[1])["centroids"])
    again = json.loads((train_t2i(replace(settings, resume=True)) / "training_log.json").read_text())
    assert again["lm_steps_done"] == 2 and again["init_from"] == log["init_from"]
