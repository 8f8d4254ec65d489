"""A prefill budget smaller than a prompt: the prompt's prefill runs in chunks between decode steps of the rows
already decoding, and every row decodes the tokens it decodes without a budget (ViSpec with a draft that reads
the prefill's hidden states and image spans, on LLaVA and on Qwen2.5-VL with its M-RoPE positions; float64)."""

from __future__ import annotations

import pytest

from tests.vlm_toys import vispec_testbed


@pytest.mark.parametrize("name", ["llava", "qwen2_5_vl"])
def test_a_prefill_in_chunks_decodes_the_rows_tokens(tmp_path, name):
    from raydec.api import caption_images
    from raydec.api.schedulers import CaptionScheduler

    target, images, decode = vispec_testbed(tmp_path, name, first_image=200, images=3, max_new_tokens=10)
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
