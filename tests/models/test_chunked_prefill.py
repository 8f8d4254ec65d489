"""A prefill budget smaller than a prompt: the prompt's prefill runs in chunks between decode steps of the rows
already decoding, and every row decodes the tokens it decodes without a budget (ViSpec with a draft that reads
the prefill's hidden states and image spans, on LLaVA and on Qwen2.5-VL with its M-RoPE positions; float64)."""

from __future__ import annotations

import pytest
import torch

from raydec.reference.shapes import make_sample, to_pil
from tests.vlm_toys import build_tiny_llava, build_tiny_qwen2_5_vl, draft_for

SAMPLED = {"temperature": 1.0}


@pytest.mark.parametrize("name", ["llava", "qwen2_5_vl"])
def test_a_prefill_in_chunks_decodes_the_rows_tokens(tmp_path, name):
    from raydec.api import caption_images, load_target
    from raydec.api.schedulers import CaptionScheduler

    builder = {"llava": build_tiny_llava, "qwen2_5_vl": build_tiny_qwen2_5_vl}[name]
    target = load_target(str(builder(tmp_path / name)), task="caption", dtype=torch.float64)
    draft_for(target, vision=True).save_pretrained(tmp_path / "draft")
    images = [to_pil(make_sample(200 + i).image) for i in range(3)]
    decode = {"method": "vispec", "draft_model": str(tmp_path / "draft"), "max_new_tokens": 10, "sampling": SAMPLED,
              "draft_tree": {"depth": 3, "top_k": 2, "total_tokens": 6}}
    expected = [row.tokens for row in caption_images(images, model=target, decode=decode, seeds=[5, 6, 7], batch_size=3)]
    scheduler = CaptionScheduler(target, decode, batch_size=3)
    scheduler.prefill_budget = 7  # prompts of tens of tokens: several chunks each
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe the image ."}]}]
    tickets = [scheduler.submit(messages, [images[0]], seed=5)]
    while not scheduler.sessions or not next(iter(scheduler.sessions.values())).active:
        scheduler.step()
    tickets += [scheduler.submit(messages, [image], seed=seed) for image, seed in zip(images[1:], (6, 7))]
    tokens, chunks = {}, 0
    while scheduler.busy:
        steps = scheduler.decode_steps
        for ticket in scheduler.step():
            tokens[ticket] = list(scheduler.tokens(ticket))
        chunks += scheduler.decode_steps == steps
    assert chunks > 6  # prefill steps: the prompts ran in chunks
    assert [tokens[t] for t in tickets] == expected
