"""Decode windows of a grouped-query target attend without repeating K/V, and decode the same tokens.

A tiny Qwen2.5-VL (4 query heads per 2 K/V heads, the real class, saved and loaded by path)
decodes ViSpec and EAGLE tree windows and SJD windows. Hugging Face's SDPA path repeats each K/V
head for its query group (``repeat_kv``) whenever a window comes with a mask;
``raydec.models.attention`` must not, and its tokens must equal those of that path and of
``generate``. The same decode on the stock path shows the counter sees the repeats.
"""

from __future__ import annotations

import pytest
import torch
import transformers.integrations.sdpa_attention as hf_sdpa
from torch.profiler import profile

from raydec.config import DraftTreeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.attention import NAME
from raydec.models.hf_vlm import VisionLanguageTarget
from raydec.speculative.engine import Engine
from raydec.speculative.proposers.draft_tree import DraftTreeProposer
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.requests import RowRequest
from tests.vlm_toys import build_tiny_qwen2_5_vl, hf_greedy_vlm, successor_draft, vlm_prompts

torch.set_num_threads(1)

NEW_TOKENS = 12
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    target = VisionLanguageTarget.from_pretrained(build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl")))
    text = target.model.config.get_text_config()
    assert text.num_attention_heads == 2 * text.num_key_value_heads  # grouped-query attention
    prompts = vlm_prompts(target, 3)
    return target, prompts, [hf_greedy_vlm(target, p, NEW_TOKENS) for p in prompts]


@pytest.fixture
def repeats(monkeypatch) -> list[tuple[int, ...]]:
    """The shapes of every K/V tensor Hugging Face's SDPA path repeats from now on."""
    shapes: list[tuple[int, ...]] = []
    original = hf_sdpa.repeat_kv

    def counting(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
        shapes.append(tuple(hidden.shape))
        return original(hidden, n_rep)

    monkeypatch.setattr(hf_sdpa, "repeat_kv", counting)
    return shapes


def _proposer(method: str, target, references):
    if method == "sjd":
        return JacobiProposer(JacobiDraftConfig(window=6), "sjd", "uniform")
    draft = successor_draft(target, references, vision=method == "vispec")
    return DraftTreeProposer(draft, DraftTreeConfig(depth=3, top_k=3, total_tokens=8))


def _decode(target, proposer, prompts):
    engine = Engine(target, proposer, GREEDY, NEW_TOKENS, eos_token_ids=target.eos_token_ids)
    return engine.generate([RowRequest(p, seed=i) for i, p in enumerate(prompts)])


@pytest.mark.parametrize("method", ["vispec", "eagle", "sjd"])
def test_grouped_query_windows_attend_without_repeating_kv(qwen, repeats, method):
    target, prompts, references = qwen
    assert target.model.config.get_text_config()._attn_implementation == NAME
    with profile(record_shapes=True) as trace:
        outputs = _decode(target, _proposer(method, target, references), prompts)
    assert repeats == [], f"{len(repeats)} K/V repeats, e.g. {repeats[:2]}"
    # nor SDPA's own GQA fallback, which repeats K/V [B, kv, S, D] with repeat_interleave
    assert not [e.input_shapes for e in trace.events() if "repeat_interleave" in e.name and len(e.input_shapes[0]) == 4]
    assert [o.tokens for o in outputs] == references
    if method != "sjd":  # drafts the target accepts (an SJD step verifies a 7-token window whatever it accepts)
        assert max(o.stats.target_forwards for o in outputs) < NEW_TOKENS

    target.model.set_attn_implementation("sdpa")  # the stock path, for the same decode
    try:
        stock = _decode(target, _proposer(method, target, references), prompts)
    finally:
        target.model.set_attn_implementation(NAME)
    assert len(repeats) > 0  # the counter sees the stock path's repeats
    assert [o.tokens for o in stock] == [o.tokens for o in outputs]
