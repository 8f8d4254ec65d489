"""The reference LLaVA's training loop runs end to end on a tiny model, auxiliary losses on,
and saves a stock checkpoint (the training-only probe is not part of it)."""

from __future__ import annotations

import json

import torch
from transformers import LlavaForConditionalGeneration

from raydec.reference.llava_vlm import VLMSizes
from raydec.reference.llava_vlm_train import TrainSettings, run_training

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
