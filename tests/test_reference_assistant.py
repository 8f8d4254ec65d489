"""The shipped LLaVA assistant of the reference VLM loads by path and keeps HF assisted greedy generation exact."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.llava_assistant import DEFAULT_ASSISTANT_DIR
from raydec.reference.llava_vlm import DEFAULT_WEIGHTS_DIR, prompt_text
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

ASSISTANT = DEFAULT_ASSISTANT_DIR


@pytest.fixture(scope="module")
def models() -> tuple[LlavaForConditionalGeneration, LlavaForConditionalGeneration, LlavaProcessor]:
    torch.set_num_threads(1)
    target = LlavaForConditionalGeneration.from_pretrained(str(DEFAULT_WEIGHTS_DIR)).eval()
    assistant = LlavaForConditionalGeneration.from_pretrained(str(ASSISTANT)).eval()
    processor = LlavaProcessor.from_pretrained(str(ASSISTANT))
    return target, assistant, processor


def test_shipped_assistant_is_small_and_shares_the_vocabulary(models) -> None:
    target, assistant, processor = models
    total = sum(p.stat().st_size for p in ASSISTANT.iterdir() if p.is_file())
    assert total < 10 * 2**20, f"shipped assistant is {total / 2**20:.1f} MB"
    assert (ASSISTANT / "MODEL_CARD.md").is_file()
    assert assistant.config.text_config.num_hidden_layers <= 2
    assert assistant.config.text_config.vocab_size == target.config.text_config.vocab_size
    assert processor.tokenizer.get_vocab() == LlavaProcessor.from_pretrained(str(DEFAULT_WEIGHTS_DIR)).tokenizer.get_vocab()


@torch.no_grad()
def test_hf_assisted_greedy_equals_plain_greedy(models) -> None:
    target, assistant, processor = models
    for seed in (HELD_OUT_SEED_START, HELD_OUT_SEED_START + 1):
        inputs = processor(text=[prompt_text()], images=[make_sample(seed).image], return_tensors="pt")
        plain = target.generate(**inputs, max_new_tokens=96, do_sample=False)
        assisted = target.generate(**inputs, max_new_tokens=96, do_sample=False, assistant_model=assistant)
        assert torch.equal(plain, assisted), f"seed {seed}: assisted output differs from plain greedy"
        assert plain.shape[1] > inputs["input_ids"].shape[1] + 5
