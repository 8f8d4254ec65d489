"""The reference LLaVA's training loop runs end to end on a tiny model, auxiliary losses on,
and saves a stock checkpoint (the training-only probe is not part of it)."""

from __future__ import annotations

import json

import torch
from transformers import LlavaForConditionalGeneration

from raydec.reference.llava.model import VLMSizes
from raydec.reference.llava.settings import TrainSettings
from raydec.reference.llava.train import run_training

TINY = VLMSizes(vision_hidden=32, vision_layers=1, vision_heads=2, vision_intermediate=64, text_hidden=48,
                text_layers=1, text_heads=2, text_intermediate=96)


def test_training_with_the_projector_probe_saves_a_stock_checkpoint(tmp_path):
    settings = TrainSettings(out_dir=tmp_path / "vlm", steps=3, batch_size=2, warmup=1, eval_every=100, eval_n=0,
                             projector_probe_weight=1.0)
    out = run_training(settings, TINY)
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps_done"] == 3 and all(torch.isfinite(torch.tensor(log["losses"])))
    model = LlavaForConditionalGeneration.from_pretrained(out, local_files_only=True)
    assert model.config.text_config.hidden_size == 48
    assert not any("probe" in name for name, _ in model.named_parameters())


def test_replaying_the_recorded_phases_retrains_the_same_weights(tmp_path):
    from safetensors.torch import load_file

    from raydec.reference.llava.recipe import recipe_phases, replay_recipe

    # by hand: a phase cut after 3 of its 4 scheduled steps, then a probe phase continuing from it
    first = TrainSettings(out_dir=tmp_path / "a", steps=4, stop_after=3, batch_size=2, warmup=1, eval_every=100,
                          eval_n=0)
    run_training(first, TINY)
    second = TrainSettings(out_dir=tmp_path / "b", steps=2, batch_size=2, lr=1e-3, warmup=1, eval_every=100,
                           eval_n=0, projector_probe_weight=1.0, focus_questions=True, init_from=tmp_path / "a",
                           first_step=3)
    run_training(second, TINY)
    log = json.loads((tmp_path / "b" / "train_log.json").read_text())
    phases = recipe_phases(log, tmp_path / "replay", tmp_path / "work")
    assert [(p.first_step, p.stop_after, p.steps) for p in phases] == [(0, 3, 4), (3, 2, 2)]
    assert phases[1].init_from == phases[0].out_dir and phases[1].projector_probe_weight == 1.0
    assert phases[1].focus_questions and not phases[0].focus_questions

    out = replay_recipe(tmp_path / "b" / "train_log.json", tmp_path / "replay", tmp_path / "work")
    by_hand, replayed = load_file(tmp_path / "b" / "model.safetensors"), load_file(out / "model.safetensors")
    assert by_hand.keys() == replayed.keys()
    assert all(torch.equal(by_hand[name], replayed[name]) for name in by_hand)
