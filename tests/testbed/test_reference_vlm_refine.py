"""Refining the reference LLaVA to finer image patches keeps what it learned: the new patch
kernel computes the old one on a pixel-repeated image, every other weight is copied, and the
training loop continues from the refined model (and its recipe replays)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.llava.model import VLMSizes, prompt_text
from raydec.reference.llava.refine import refine_patch_kernel, refine_patches, refine_position_table
from raydec.reference.llava.recipe import recipe_phases
from raydec.reference.llava.settings import TrainSettings
from raydec.reference.llava.train import run_training
from raydec.reference.shapes import make_sample

TINY = VLMSizes(vision_hidden=32, vision_layers=1, vision_heads=2, vision_intermediate=64, text_hidden=48,
                text_layers=1, text_heads=2, text_intermediate=96)


def test_refined_kernel_sees_what_the_old_one_saw_on_a_pixel_repeated_image():
    generator = torch.Generator().manual_seed(0)
    old = torch.randn(5, 3, 8, 8, generator=generator, dtype=torch.float64)
    image = torch.randn(2, 3, 16, 16, generator=generator, dtype=torch.float64)
    repeated = image.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)  # [2, 3, 32, 32]
    expected = torch.nn.functional.conv2d(repeated, old, stride=8)  # [2, 5, 4, 4]
    got = torch.nn.functional.conv2d(image, refine_patch_kernel(old, 2), stride=4)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="factor=3"):
        refine_patch_kernel(old, 3)


def test_refined_position_table_keeps_cls_and_a_constant_grid():
    table = torch.cat([torch.full((1, 4), 7.0), torch.full((16, 4), -2.0)])  # CLS + 4x4 grid
    finer = refine_position_table(table, 2)
    assert finer.shape == (1 + 64, 4)
    assert torch.equal(finer[0], table[0])
    torch.testing.assert_close(finer[1:], torch.full((64, 4), -2.0))


def test_refine_then_train_continues_from_the_refined_model(tmp_path):
    first = TrainSettings(out_dir=tmp_path / "coarse", steps=2, batch_size=2, warmup=1, eval_every=100, eval_n=0)
    run_training(first, TINY)
    coarse = LlavaForConditionalGeneration.from_pretrained(tmp_path / "coarse").eval()
    coarse_processor = LlavaProcessor.from_pretrained(tmp_path / "coarse")

    fine, fine_processor = refine_patches(coarse, coarse_processor, 2)
    assert fine.config.vision_config.patch_size == 4 and fine.config.image_seq_length == 256
    inputs = fine_processor(text=[prompt_text()], images=[make_sample(1_000_000).image], return_tensors="pt")
    assert int((inputs["input_ids"] == fine.config.image_token_id).sum()) == 256
    old_state, new_state = coarse.state_dict(), fine.state_dict()
    refined_names = {name for name in new_state if "patch_embedding" in name or "position_embedding" in name}
    assert {name.rsplit(".", 1)[0] for name in refined_names} == {
        "model.vision_tower.embeddings.patch_embedding",
        "model.vision_tower.embeddings.position_embedding",
    }
    for name, value in new_state.items():
        if name not in refined_names and not name.endswith("position_ids"):
            assert torch.equal(value, old_state[name]), name
    with torch.no_grad():
        fine.eval()(**inputs)  # the stock forward runs on the 256-token image span

    second = TrainSettings(out_dir=tmp_path / "fine", steps=2, batch_size=2, warmup=1, eval_every=100, eval_n=0,
                           init_from=tmp_path / "coarse", first_step=2, refine_patches=2, projector_probe_weight=1.0)
    run_training(second, TINY)
    trained = LlavaForConditionalGeneration.from_pretrained(tmp_path / "fine")
    assert trained.config.image_seq_length == 256
    assert LlavaProcessor.from_pretrained(tmp_path / "fine").patch_size == 4
    log = json.loads((tmp_path / "fine" / "train_log.json").read_text())
    phases = recipe_phases(log, tmp_path / "replay", tmp_path / "work")
    assert [p.refine_patches for p in phases] == [0, 2]


def test_refining_needs_a_trained_model(tmp_path):
    with pytest.raises(ValueError, match="init_from"):
        run_training(TrainSettings(out_dir=tmp_path / "x", steps=1, batch_size=2, eval_n=0, refine_patches=2), TINY)
