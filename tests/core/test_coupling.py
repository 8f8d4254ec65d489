"""Gumbel coupling: a row's tokens are its seed's, whatever decoded it.

In ``coupling="gumbel"`` the target's token at generated position j is argmax(log P_j + G_j),
with G_j a function of (seed, j) alone, and a draft is accepted iff it equals that token. So
every method, draft shape, batch, refill, cancel, guidance and per-row sampling commits, for
each row, exactly the tokens plain AR decoding commits with the same seed (float64 targets:
the same P to the last bit). The law tests check that those tokens follow the target's law;
the broken variants (noise reused across positions, noise that follows the window offset or
the batch row, a draft accepted on a near-match) must fail.
"""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, DraftTreeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.causal_lm import CfgPrompt
from raydec.speculative import random as streams
from raydec.speculative import verify_step
from raydec.speculative.engine import Engine
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.draft_tree import DraftTreeProposer
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.requests import RowRequest
from raydec.speculative.sampling import VocabConstraint
from tests.broken import near_match_coupled_verifier
from tests.lawtest import SAMPLES, compare_to_law, sample_engine
from tests.proposers import RandomTreeProposer
from tests.toys import lm_law

torch.set_num_threads(1)

SAMPLING = SamplingConfig(temperature=1.0)
CFG = SamplingConfig(temperature=1.0, top_k=5, cfg_scale=2.5)
LENGTH = 12
TREE = DraftTreeConfig(depth=3, top_k=2, total_tokens=6)


@pytest.fixture(scope="module")
def eagle_draft(llama):
    """A random text-only draft for ``llama`` in the inference form loaded drafts run."""
    from raydec.models.vispec_draft import DraftConfig, VispecDraft

    torch.manual_seed(0)
    draft = VispecDraft(DraftConfig.for_target(llama.model.config, vision=False, num_q=1))
    draft.attach_target(llama.model.get_input_embeddings(), llama.model.get_output_embeddings())
    return draft.to(torch.float64).eval().prepare_inference()


def _proposers(draft) -> dict:
    """Every method at one or more shapes (fresh proposer per engine)."""
    jacobi = JacobiDraftConfig
    return {
        "sjd w3": lambda: JacobiProposer(jacobi(window=3), "sjd"),
        "sjd_ac w6 left": lambda: JacobiProposer(jacobi(window=6), "sjd_ac", "left"),
        "sjd_pac k2 d2": lambda: JacobiProposer(jacobi(window=7, branching=2, tree_depth=2), "sjd_pac"),
        "sjd_pac k3 d1 above": lambda: JacobiProposer(jacobi(window=5, branching=3, tree_depth=1), "sjd_pac", "above", grid_width=3),
        "random tree": lambda: RandomTreeProposer(jacobi(window=5, branching=2, tree_depth=1), "dense", sharpness=3.0),
        "eagle": lambda: DraftTreeProposer(draft, TREE),
    }


def _requests(count: int, sampling: SamplingConfig = SAMPLING, per_row: bool = False) -> list[RowRequest]:
    """Rows of several prompts and caps; with ``per_row`` every third row brings its own sampling."""
    own = [None, SamplingConfig(temperature=0.7, top_k=3), SamplingConfig(temperature=1.3, top_p=0.8)]
    prompts = [CfgPrompt(cond=[1 + i % 7, 5, 6], uncond=[0]) if sampling.uses_cfg else [1 + i % 7, 5, 2 + i % 3] for i in range(count)]
    return [RowRequest(prompt, seed=1000 + i, max_new_tokens=LENGTH - (i % 3) * 2, sampling=own[i % 3] if per_row else None)
            for i, prompt in enumerate(prompts)]


def _engine(target, proposer, sampling: SamplingConfig = SAMPLING, compile: str = "off") -> Engine:
    return Engine(target, proposer, sampling, LENGTH, coupling="gumbel", compile=compile)


def _decode(engine: Engine, requests: list[RowRequest], batch: int, cancel_after: int | None = None) -> list[list[int]]:
    """Every request through one session of ``batch`` rows (queued rows refill finished places);
    with ``cancel_after``, request 1 is cancelled after that many steps."""
    session = engine.session(batch_size=batch)
    handles = [session.submit(request) for request in requests]
    steps = 0
    while session.busy:
        session.step()
        steps += 1
        if cancel_after is not None and steps == cancel_after:
            session.cancel(handles[1])
    return [session.output(handle).tokens for handle in handles]


def _alone(target, requests: list[RowRequest], sampling: SamplingConfig = SAMPLING) -> list[list[int]]:
    """Gumbel-mode AR, one row at a time: each seed's reference tokens."""
    engine = _engine(target, ARProposer(), sampling)
    return [_decode(engine, [request], 1)[0] for request in requests]


def test_every_method_shape_and_batch_commits_the_tokens_ar_does(llama, eagle_draft):
    requests = _requests(8, per_row=True)
    reference = _alone(llama, requests)
    for name, make in _proposers(eagle_draft).items():
        for batch in (1, 3, 8):
            got = _decode(_engine(llama, make()), requests, batch)
            assert got == reference, f"{name}, batch {batch}"


def test_refills_cancels_and_captured_steps_keep_each_rows_tokens(llama, eagle_draft):
    requests = _requests(7)
    reference = _alone(llama, requests)
    got = _decode(_engine(llama, JacobiProposer(JacobiDraftConfig(window=7, branching=2, tree_depth=2), "sjd_pac")), requests, 3, cancel_after=2)
    assert got[1] == reference[1][: len(got[1])] and len(got[1]) < len(reference[1])
    assert got[:1] + got[2:] == reference[:1] + reference[2:]
    for proposer in (JacobiProposer(JacobiDraftConfig(window=4), "sjd"), DraftTreeProposer(eagle_draft, TREE)):
        engine = _engine(llama, proposer, compile="on")
        assert _decode(engine, requests, 3) == reference, type(proposer).__name__
        assert not any(graph.eager_calls for graph in engine.step_graphs())


def test_guidance_with_a_vocabulary_constraint_commits_the_tokens_ar_does(llama):
    requests = _requests(5, CFG)
    constraint = VocabConstraint(allowed=torch.tensor([True] * 7 + [False]))
    alone = Engine(llama, ARProposer(), CFG, LENGTH, coupling="gumbel", constraint=constraint)
    reference = [_decode(alone, [request], 1)[0] for request in requests]
    for proposer in (JacobiProposer(JacobiDraftConfig(window=6, branching=2, tree_depth=1), "sjd_pac"), JacobiProposer(JacobiDraftConfig(window=4), "sjd")):
        engine = Engine(llama, proposer, CFG, LENGTH, coupling="gumbel", constraint=constraint)
        assert _decode(engine, requests, 3) == reference


def test_coupled_rows_keep_their_tokens_beside_rows_that_are_not(llama):
    requests = _requests(6)
    reference = _alone(llama, requests)
    for i, request in enumerate(requests):
        request.coupling = "rejection" if i % 2 else None  # the engine's gumbel for the even rows
    got = _decode(_engine(llama, JacobiProposer(JacobiDraftConfig(window=6, branching=2, tree_depth=1), "sjd_pac")), requests, 6)
    assert got[0::2] == reference[0::2]
    assert got[1::2] != reference[1::2]  # the rejection rows: the same law, other tokens


def test_a_vispec_draft_commits_the_tokens_ar_does(tmp_path):
    from raydec.models.registry import load_vlm_target
    from tests.vlm_toys import build_tiny_llava, draft_for, vlm_prompts

    target = load_vlm_target(build_tiny_llava(tmp_path / "llava", dtype=torch.float64), dtype=torch.float64)
    prompts = vlm_prompts(target, 3)
    requests = [RowRequest(prompt, seed=7 + i, max_new_tokens=LENGTH) for i, prompt in enumerate(prompts)]
    eos = target.eos_token_ids
    alone = Engine(target, ARProposer(), SAMPLING, LENGTH, coupling="gumbel", eos_token_ids=eos)
    reference = [_decode(alone, [request], 1)[0] for request in requests]
    engine = Engine(target, DraftTreeProposer(draft_for(target, vision=True), TREE), SAMPLING, LENGTH, coupling="gumbel", eos_token_ids=eos)
    assert _decode(engine, requests, 3) == reference


# ------------------------------------------------------------------------------------------
# The law: Gumbel-max sampling is the target's


def test_coupled_ar_and_a_drafting_tree_follow_the_targets_law(llama):
    config = DecodeConfig(max_new_tokens=4, sampling=SAMPLING)
    for proposer in (ARProposer(), RandomTreeProposer(JacobiDraftConfig(window=5, branching=2, tree_depth=1), "dense", sharpness=3.0)):
        samples = sample_engine(llama, proposer, config, [[3, 1, 4]], list(range(SAMPLES)), 5000, coupling="gumbel")
        report = compare_to_law(samples, lm_law(llama, [3, 1, 4], 4, SAMPLING))
        assert report.passed, f"{type(proposer).__name__}: {report}"


def test_guided_top_k_coupled_sampling_follows_the_targets_law(llama):
    config = DecodeConfig(max_new_tokens=4, sampling=CFG)
    prompt = CfgPrompt(cond=[5, 2, 6], uncond=[0])
    proposer = JacobiProposer(JacobiDraftConfig(window=4, branching=2, tree_depth=1), "sjd_pac")
    samples = sample_engine(llama, proposer, config, [prompt], list(range(SAMPLES)), 5000, coupling="gumbel")
    report = compare_to_law(samples, lm_law(llama, prompt, 4, CFG))
    assert report.passed, str(report)


# ------------------------------------------------------------------------------------------
# Broken variants must fail


def test_noise_reused_across_positions_fails_the_law(llama, monkeypatch):
    real = streams.position_exponentials
    every_position_the_same = lambda seeds, positions, vocab: real(seeds, positions * 0, vocab)  # noqa: E731
    monkeypatch.setattr(streams, "position_exponentials", every_position_the_same)
    monkeypatch.setattr(verify_step, "position_exponentials", every_position_the_same)
    config = DecodeConfig(max_new_tokens=4, sampling=SAMPLING)
    samples = sample_engine(llama, ARProposer(), config, [[3, 1, 4]], list(range(SAMPLES)), 5000, coupling="gumbel")
    assert not compare_to_law(samples, lm_law(llama, [3, 1, 4], 4, SAMPLING)).passed


@pytest.mark.parametrize("flaw", ["window offset", "batch row"])
def test_noise_that_follows_the_window_or_the_batch_row_changes_the_tokens(llama, monkeypatch, flaw):
    requests = _requests(6)
    reference = _alone(llama, requests)
    real = streams.position_exponentials

    def broken(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
        if flaw == "window offset":  # the offset from the step's root instead of the generated position
            return real(seeds, positions - positions[:, :1], vocab)
        return real(torch.arange(len(seeds), device=seeds.device), positions, vocab)  # the batch row instead of the seed

    monkeypatch.setattr(verify_step, "position_exponentials", broken)
    got = _decode(_engine(llama, JacobiProposer(JacobiDraftConfig(window=5), "sjd")), requests, 3)
    assert got != reference


def test_a_draft_accepted_on_a_near_match_fails(llama, monkeypatch):
    monkeypatch.setattr(verify_step, "verify_coupled", near_match_coupled_verifier)
    requests = _requests(6)
    reference = _alone(llama, requests)
    proposer = lambda: RandomTreeProposer(JacobiDraftConfig(window=5, branching=2, tree_depth=1), "dense", sharpness=3.0)  # noqa: E731
    assert _decode(_engine(llama, proposer()), requests, 3) != reference
    config = DecodeConfig(max_new_tokens=4, sampling=SAMPLING)
    samples = sample_engine(llama, proposer(), config, [[3, 1, 4]], list(range(SAMPLES)), 5000, coupling="gumbel")
    assert not compare_to_law(samples, lm_law(llama, [3, 1, 4], 4, SAMPLING)).passed
