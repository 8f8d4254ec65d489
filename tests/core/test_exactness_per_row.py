"""Per-request sampling in one batch: every row keeps its own lossless law.

Rows of one batch ask for different temperatures, top-k and top-p (online traffic mixes
requests); the engine builds each row's P with its own parameters, so the samples of each
kind of row must match the exact AR law of that row's own sampling (tests/lawtest.py), at
20,000 samples each, with a drafting tree (siblings without replacement) and with SJD-PAC.
A greedy row in the same batch equals Hugging Face's greedy decoding.
"""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.jacobi import JacobiProposer
from tests.proposers import RandomTreeProposer
from tests.lawtest import compare_to_law
from tests.toys import lm_law

torch.set_num_threads(1)

SAMPLES = 20_000
LENGTH = 4
PROMPT = [3, 1, 4]
KINDS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=3),
    SamplingConfig(temperature=1.4, top_p=0.8),
]


def _proposer(name: str, draft: JacobiDraftConfig):
    if name == "tree":
        return RandomTreeProposer(draft, "dense", sharpness=3.0)
    return JacobiProposer(draft, "sjd_pac")


@pytest.mark.parametrize("name", ["tree", "sjd_pac"])
def test_rows_with_different_sampling_each_match_their_own_law(llama, name):
    draft = JacobiDraftConfig(window=6, branching=2, tree_depth=1)
    config = DecodeConfig(max_new_tokens=LENGTH, sampling=KINDS[0], jacobi=draft, compaction="always")
    engine = Engine(llama, _proposer(name, draft), config.sampling, config.max_new_tokens, compaction=config.compaction)
    rows = len(KINDS) * SAMPLES
    requests = [RowRequest(PROMPT, seed=i, sampling=KINDS[i % len(KINDS)]) for i in range(rows)]
    outputs = []
    for start in range(0, rows, 6000):
        outputs += engine.generate(requests[start : start + 6000])
    tokens = torch.tensor([out.tokens for out in outputs])
    for kind, sampling in enumerate(KINDS):
        report = compare_to_law(tokens[kind :: len(KINDS)], lm_law(llama, PROMPT, LENGTH, sampling))
        assert report.passed, f"{sampling}: {report}"


def test_per_row_sampling_has_teeth(llama, monkeypatch):
    """If every row were decoded with the first row's parameters, the other rows' samples fail."""
    import raydec.speculative.engine as engine_module

    draft = JacobiDraftConfig(window=6, branching=2, tree_depth=1)
    config = DecodeConfig(max_new_tokens=LENGTH, sampling=KINDS[0], jacobi=draft, compaction="always")
    monkeypatch.setattr(engine_module.DecodeSession, "_sampling_of", lambda self, handles, device: KINDS[0])
    engine = Engine(llama, _proposer("tree", draft), config.sampling, config.max_new_tokens, compaction=config.compaction)
    requests = [RowRequest(PROMPT, seed=i, sampling=KINDS[1]) for i in range(SAMPLES)]
    tokens = torch.tensor([out.tokens for out in engine.generate(requests)])
    assert not compare_to_law(tokens, lm_law(llama, PROMPT, LENGTH, KINDS[1])).passed


def test_a_greedy_row_in_a_sampled_batch_decodes_greedily(llama):
    draft = JacobiDraftConfig(window=6, branching=2, tree_depth=1)
    config = DecodeConfig(max_new_tokens=8, sampling=KINDS[0], jacobi=draft)
    greedy = SamplingConfig(temperature=0.0)
    expected = llama.model.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False,
                                    pad_token_id=0, eos_token_id=None)[0, len(PROMPT):].tolist()
    for name in ("tree", "sjd_pac"):
        engine = Engine(llama, _proposer(name, draft), config.sampling, config.max_new_tokens, compaction=config.compaction)
        outs = engine.generate([RowRequest(PROMPT, seed=i, sampling=greedy if i == 2 else KINDS[i % 3]) for i in range(5)])
        assert outs[2].tokens == expected, name


def test_per_row_stop_tokens_and_caps(llama):
    config = DecodeConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=0.0), jacobi=JacobiDraftConfig(window=4))
    engine = Engine(llama, JacobiProposer(config.jacobi, "sjd_ac"), config.sampling, config.max_new_tokens, compaction=config.compaction)
    plain = engine.generate([RowRequest(PROMPT, seed=0)])[0].tokens
    stop = plain[3]
    outs = engine.generate([RowRequest(PROMPT, seed=0, stop_token_ids=[stop]), RowRequest(PROMPT, seed=0, max_new_tokens=2),
                            RowRequest(PROMPT, seed=0)])
    assert outs[0].tokens == plain[: plain.index(stop) + 1] and outs[0].stats.finish_reason == "eos"
    assert outs[1].tokens == plain[:2] and outs[1].stats.finish_reason == "length"
    assert outs[2].tokens == plain


def test_a_request_with_its_own_guidance_is_refused_by_name(llama):
    config = DecodeConfig(max_new_tokens=4, sampling=SamplingConfig(temperature=1.0), jacobi=JacobiDraftConfig(window=4))
    session = Engine(llama, JacobiProposer(config.jacobi, "sjd"), config.sampling, config.max_new_tokens, compaction=config.compaction).session()
    with pytest.raises(ValueError, match=r"requests\[0\].sampling.cfg_scale: 2.0 differs from the engine's 1.0"):
        session.submit(RowRequest(PROMPT, seed=0, sampling=SamplingConfig(cfg_scale=2.0)))
