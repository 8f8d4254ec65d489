"""Hugging Face's repetition penalty: every method keeps the law of plain sampling with it.

A tree node's context is the row's prompt and generated tokens plus the tokens on the node's
own path, so the penalty a draft position sees is the one plain decoding would have applied.
Checked against Hugging Face ``generate(repetition_penalty=...)`` (greedy, with drafts that
are accepted) and against an exact law built with HF's own logits processor (temperature 1).
"""

from __future__ import annotations

import logging

import pytest
import torch

from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.proposers.oracle import OracleProposer
from tests.proposers import RandomTreeProposer
from tests.lawtest import SAMPLES, compare_to_law, sample_engine
from tests.toys import hf_greedy_lm, lm_law, tiny_llama

torch.set_num_threads(1)

PROMPTS = [[1, 5, 7, 9, 2], [3, 4], [8, 8, 8, 8, 8, 8, 2, 11], [10]]
PENALTY = 3.0  # strong: it changes many of the tiny model's greedy choices
GREEDY = SamplingConfig(temperature=0.0, repetition_penalty=PENALTY)


@pytest.fixture(scope="module")
def llama32(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("l32"), vocab=64, seed=0, dtype=torch.float32, layers=2, hidden=32)


def test_greedy_with_a_penalty_equals_hf_generate_and_drafts_are_accepted(llama32):
    length = 24
    expected = hf_greedy_lm(llama32, PROMPTS, length, repetition_penalty=PENALTY)
    assert expected != hf_greedy_lm(llama32, PROMPTS, length), "the penalty should change the greedy output"
    config = DecodeConfig(max_new_tokens=length, sampling=GREEDY, jacobi=JacobiDraftConfig(window=6))
    ar = Engine(llama32, ARProposer(), config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(p, seed=0) for p in PROMPTS])
    assert [o.tokens for o in ar] == expected
    # the oracle drafts the true continuation: every draft node's P must see its own path
    oracle = OracleProposer(window=7, references={i: t for i, t in enumerate(expected)})
    fast = Engine(llama32, oracle, config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(p, seed=0) for p in PROMPTS])
    assert [o.tokens for o in fast] == expected
    assert all(o.stats.target_forwards == 4 for o in fast)  # 1 + 8 + 8 + 7 tokens
    for proposer in (JacobiProposer(config.jacobi), RandomTreeProposer(JacobiDraftConfig(window=8, branching=2, tree_depth=2), "dense")):
        outs = Engine(llama32, proposer, config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(p, seed=0) for p in PROMPTS])
        assert [o.tokens for o in outs] == expected, type(proposer).__name__


def test_a_path_blind_context_fails(llama32, monkeypatch):
    """If draft nodes saw only the row's committed context (not their own path), the oracle's
    accepted drafts would be scored under the wrong penalty: the output leaves HF's."""
    length = 24
    expected = hf_greedy_lm(llama32, PROMPTS, length, repetition_penalty=PENALTY)
    config = DecodeConfig(max_new_tokens=length, sampling=GREEDY)
    from raydec.speculative.engine import DecodeSession

    original = DecodeSession._context

    def row_context_only(self, handles, vocab, tree=None):
        context = original(self, handles, vocab)
        return context if tree is None else context.expand(-1, tree.num_nodes, -1)

    monkeypatch.setattr(DecodeSession, "_context", row_context_only)
    oracle = OracleProposer(window=7, references={i: t for i, t in enumerate(expected)})
    outs = Engine(llama32, oracle, config.sampling, config.max_new_tokens, compaction=config.compaction).generate([RowRequest(p, seed=0) for p in PROMPTS])
    assert [o.tokens for o in outs] != expected


def test_sampling_with_a_penalty_keeps_the_law(tmp_path):
    llama = tiny_llama(tmp_path / "toy", vocab=8, seed=1)
    sampling = SamplingConfig(temperature=1.0, repetition_penalty=2.0)
    spec = JacobiDraftConfig(window=6, branching=2, tree_depth=2)
    config = DecodeConfig(max_new_tokens=4, sampling=sampling, jacobi=spec, compaction="always")
    samples = sample_engine(llama, RandomTreeProposer(spec, "dense", sharpness=3.0), config, [[3, 1, 4]], list(range(SAMPLES)), 5000)
    assert compare_to_law(samples, lm_law(llama, [3, 1, 4], 4, sampling)).passed
    # the same samples against the law without the penalty: the test can tell the difference
    assert not compare_to_law(samples, lm_law(llama, [3, 1, 4], 4, SamplingConfig(temperature=1.0))).passed


def test_a_penalty_with_cfg_is_refused(llama32):
    config = DecodeConfig(sampling=SamplingConfig(repetition_penalty=1.2, cfg_scale=3.0))
    with pytest.raises(ValueError, match=r"repetition_penalty=1.2 is not supported with classifier-free guidance"):
        Engine(llama32, ARProposer(), config.sampling, config.max_new_tokens, compaction=config.compaction)


def test_generation_config_defaults_resolve_as_hf_and_unapplied_settings_are_named(caplog, monkeypatch):
    from transformers import GenerationConfig

    from raydec.models import generation_config
    from raydec.models.generation_config import sampling_from_generation_config

    monkeypatch.setattr(generation_config, "_warned", set())

    sampling = sampling_from_generation_config(GenerationConfig(do_sample=True, temperature=0.7), "logits", repetition_penalty=True)
    assert sampling.top_k == 50 and sampling.temperature == 0.7 and sampling.repetition_penalty == 1.0
    qwen_like = GenerationConfig(do_sample=True, temperature=0.1, top_p=0.001, top_k=1, repetition_penalty=1.05)
    assert sampling_from_generation_config(qwen_like, "logits", repetition_penalty=True).repetition_penalty == 1.05
    with caplog.at_level(logging.WARNING, logger="raydec.models.generation_config"):
        image_path = sampling_from_generation_config(qwen_like, "logits")
    assert image_path.repetition_penalty == 1.0 and "repetition_penalty=1.05" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="raydec.models.generation_config"):
        sampling_from_generation_config(GenerationConfig(num_beams=4, no_repeat_ngram_size=3), "logits", repetition_penalty=True)
    assert "num_beams=4" in caplog.text and "no_repeat_ngram_size=3" in caplog.text and "does not apply" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="raydec.models.generation_config"):  # once per process, not per call
        sampling_from_generation_config(GenerationConfig(num_beams=4, no_repeat_ngram_size=3), "logits", repetition_penalty=True)
    assert "num_beams" not in caplog.text


def test_captions_follow_the_checkpoints_penalty_as_hf_generate_does(tmp_path):
    """A VLM checkpoint whose generation_config sets a repetition penalty (Qwen2.5-VL's do):
    captioning's default sampling keeps it, and the image placeholders and the question count
    as context, as in HF ``generate``."""
    from raydec.api.inputs import caption_decode_config
    from raydec.config import DraftTreeConfig
    from raydec.models.hf_vlm import VisionLanguageTarget
    from raydec.speculative.proposers.draft_tree import DraftTreeProposer
    from tests.vlm_toys import draft_for, hf_greedy_vlm, vlm_prompts
    from tests.vlm_toys import build_tiny_llava

    llava = VisionLanguageTarget.from_pretrained(build_tiny_llava(tmp_path / "llava"))
    prompts = vlm_prompts(llava, 3)
    plain = [hf_greedy_vlm(llava, p, 16) for p in prompts]
    llava.model.generation_config.repetition_penalty = PENALTY
    expected = [hf_greedy_vlm(llava, p, 16) for p in prompts]
    assert expected != plain
    config = caption_decode_config(None, llava).model_copy(update={"max_new_tokens": 16})
    assert config.sampling == SamplingConfig(temperature=0.0, repetition_penalty=PENALTY)
    tree = DraftTreeConfig(depth=3, top_k=3, total_tokens=10)
    config = config.model_copy(update={"draft_tree": tree})
    for proposer in (ARProposer(), DraftTreeProposer(draft_for(llava, True), tree)):
        outs = Engine(llava, proposer, config.sampling, config.max_new_tokens, compaction=config.compaction, eos_token_ids=llava.eos_token_ids).generate([RowRequest(p, seed=0) for p in prompts])
        assert [o.tokens for o in outs] == expected


def test_sampling_fields_set_override_the_checkpoints_one_by_one(tmp_path):
    """As HF ``generate(temperature=...)`` keeps the rest of the generation_config."""
    from raydec.api import load_target
    from raydec.api.inputs import caption_decode_config, image_decode_config
    from raydec.config import DecodeConfig
    from raydec.models.hf_vlm import VisionLanguageTarget
    from tests.vlm_toys import build_tiny_llava

    janus = load_target("reference", task="t2i")
    checkpoint = janus.default_sampling()
    assert checkpoint.uses_cfg and checkpoint.top_k  # the reference Janus samples with CFG and top-k
    merged = image_decode_config(DecodeConfig.model_validate({"sampling": {"temperature": 0.5}}), janus).sampling
    assert merged == checkpoint.model_copy(update={"temperature": 0.5})
    whole = image_decode_config(DecodeConfig(sampling=SamplingConfig(temperature=0.5, cfg_scale=1.0, top_k=0)), janus).sampling
    assert not whole.uses_cfg and whole.top_k == 0  # fields set explicitly win, defaults included
    llava = VisionLanguageTarget.from_pretrained(build_tiny_llava(tmp_path / "llava"))
    llava.model.generation_config.repetition_penalty = 1.3
    sampled = caption_decode_config(DecodeConfig.model_validate({"sampling": {"temperature": 1.0}}), llava).sampling
    assert sampled == SamplingConfig(temperature=1.0, top_k=50, repetition_penalty=1.3)  # HF's top_k default, its penalty
