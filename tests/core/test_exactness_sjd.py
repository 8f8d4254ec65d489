"""Exactness harness for the SJD family (sjd, sjd_ac, sjd_pac) and their broken variants.

Same law test as tests/core/test_exactness.py: >= 20,000 samples (5,000 on the batching paths), chi-square on every marginal and
pairwise joint at one family-wise false-alarm rate. Sequences are long enough (8 tokens on the
Markov chain) for carried-over drafts, coupling and proactive trees to matter.
"""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.causal_lm import CfgPrompt
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.sampling import VocabConstraint, sample_with_uniform
from raydec.speculative.tree import DraftTree
from tests.lawtest import PATH_SAMPLES, SAMPLES, compare_to_law, sample_engine
from tests.toys import lm_law, markov_law, random_markov

torch.set_num_threads(1)

SAMPLING = SamplingConfig(temperature=1.0)


@pytest.fixture(scope="module")
def markov():
    return random_markov(vocab=6, seed=5, sharpness=1.0)


def _config(length: int, sampling: SamplingConfig = SAMPLING, **draft) -> DecodeConfig:
    return DecodeConfig(max_new_tokens=length, sampling=sampling, jacobi=JacobiDraftConfig(**draft))


@pytest.mark.parametrize(
    "variant,init,draft",
    [
        ("sjd", "uniform", dict(window=4)),
        ("sjd", "left", dict(window=4)),
        ("sjd_ac", "uniform", dict(window=4)),
        ("sjd_ac", "above", dict(window=4)),
        ("sjd_pac", "uniform", dict(window=6, branching=2, tree_depth=2)),
        ("sjd_pac", "left", dict(window=5, branching=3, tree_depth=1)),
    ],
)
def test_sjd_family_on_markov_chain(markov, variant, init, draft):
    length = 8
    config = _config(length, **draft)
    proposer = JacobiProposer(config.jacobi, variant, init, grid_width=3)
    samples = sample_engine(markov, proposer, config, [[2]], list(range(SAMPLES)), 5000)
    report = compare_to_law(samples, markov_law(markov, [2], length, SAMPLING))
    assert report.passed, str(report)


def test_sjd_pac_cfg_topk_spatial_prior_on_llama(llama):
    sampling = SamplingConfig(temperature=1.0, top_k=4, cfg_scale=2.0)
    constraint = VocabConstraint(allowed=torch.tensor([True] * 7 + [False]))
    length = 5
    config = _config(length, sampling, window=6, branching=2, tree_depth=2)
    prompt = CfgPrompt(cond=[5, 2, 6], uncond=[0])
    proposer = JacobiProposer(config.jacobi, "sjd_pac", "above", grid_width=2)
    samples = sample_engine(llama, proposer, config, [prompt], list(range(SAMPLES)), 5000, constraint=constraint)
    report = compare_to_law(samples, lm_law(llama, prompt, length, sampling, constraint))
    assert report.passed, str(report)


def test_sjd_pac_batch_one(markov):
    length = 5
    config = _config(length, window=5, branching=2, tree_depth=1)
    proposer = JacobiProposer(config.jacobi, "sjd_pac", "uniform")
    samples = sample_engine(markov, proposer, config, [[3]], list(range(PATH_SAMPLES)), 1)
    report = compare_to_law(samples, markov_law(markov, [3], length, SAMPLING))
    assert report.passed, str(report)


def test_sjd_pac_batch_four_ragged(markov):
    """Batch 4 with prompts of different lengths and rows that stop at different lengths."""
    length = 7
    config = _config(length, window=5, branching=2, tree_depth=1)
    engine = Engine(markov, JacobiProposer(config.jacobi, "sjd_pac", "left"), config.sampling, config.max_new_tokens)
    prompts = [[4], [0, 4], [5, 5, 4], [1, 2, 3, 4]]
    caps = [length, length - 2, length, length - 1]
    rows = []
    for call in range(PATH_SAMPLES // 4):
        outs = engine.generate([RowRequest(prompts[i], seed=4 * call + i, max_new_tokens=caps[i]) for i in range(4)])
        rows += [o.tokens[: length - 2] for o in outs]
    report = compare_to_law(torch.tensor(rows), markov_law(markov, [4], length - 2, SAMPLING))
    assert report.passed, str(report)


def test_sjd_pac_continuous_batching(markov):
    """One generate call, at most 4 rows at a time: queued rows join as others finish, with
    prompts and length caps that differ, so rows join at every stage of the others' decoding."""
    length = 7
    config = _config(length, window=5, branching=2, tree_depth=1)
    engine = Engine(markov, JacobiProposer(config.jacobi, "sjd_pac", "left"), config.sampling, config.max_new_tokens)
    prompts = [[4], [0, 4], [5, 5, 4], [1, 2, 3, 4]]
    caps = [length - 2, length, length - 1, length - 2, length]
    requests = [RowRequest(prompts[i % 4], seed=i, max_new_tokens=caps[i % 5]) for i in range(PATH_SAMPLES)]
    rows = [o.tokens[: length - 2] for o in engine.generate(requests, batch_size=4)]
    report = compare_to_law(torch.tensor(rows), markov_law(markov, [4], length - 2, SAMPLING))
    assert report.passed, str(report)


class StructureCheckingProposer(JacobiProposer):
    """Checks every tree: the depth and ancestor mask the proposer records from its fixed layout
    equal what the tree's own fields imply (missing candidates included)."""

    checked = missing = 0

    def propose(self, state):
        tree = super().propose(state)
        fresh = DraftTree(tree.tokens, tree.parents, tree.valid, tree.proposal_index, tree.without_replacement, tree.proposal_probs)
        assert torch.equal(tree.ancestor_mask(), fresh.ancestor_mask()) and torch.equal(tree.depth(), fresh.depth())
        assert fresh.children_bound() <= tree.max_children and fresh.branch_node_bound() <= tree.branch_nodes
        StructureCheckingProposer.checked += 1
        StructureCheckingProposer.missing += int((~tree.valid).sum())
        return tree


@pytest.mark.parametrize("draft", [dict(window=4), dict(window=14, branching=3, tree_depth=2), dict(window=6, branching=4, tree_depth=1)])
def test_jacobi_trees_record_the_structure_their_fields_imply(llama, draft):
    sampling = SamplingConfig(temperature=1.0, top_k=2)  # supports of 2 tokens: extra candidates go missing
    config = _config(6, sampling, **draft)
    StructureCheckingProposer.checked = StructureCheckingProposer.missing = 0
    variant = "sjd_pac" if "branching" in draft else "sjd"
    sample_engine(llama, StructureCheckingProposer(config.jacobi, variant, "uniform"), config, [[5, 2, 6], [1]], list(range(8)), 4)
    assert StructureCheckingProposer.checked >= 4
    assert (StructureCheckingProposer.missing > 0) == (variant == "sjd_pac")


# ------------------------------------------------------------------------------------------
# Broken variants of AC and PD must fail


class OldProposalAC(JacobiProposer):
    """Pitfall 4: after coupling, records the OLD proposal instead of Q := P."""

    def couple(self, p, old_tokens, old_q, uniforms):
        tokens, _ = super().couple(p, old_tokens, old_q, uniforms)
        return tokens, old_q


class DuplicateCandidatesPD(JacobiProposer):
    """Pitfall 2: extra tree candidates drawn WITH replacement from q (duplicates possible)
    while the tree still claims sampling without replacement."""

    def extra_candidates(self, q, first, uniforms):
        picks = torch.stack([sample_with_uniform(q.to(torch.float64), uniforms[:, k]) for k in range(uniforms.shape[1])], dim=1)
        return picks, torch.ones_like(picks, dtype=torch.bool)


def test_ac_recording_old_proposal_fails(markov):
    length = 8
    config = _config(length, window=4)
    samples = sample_engine(markov, OldProposalAC(config.jacobi, "sjd_ac", "uniform"), config, [[2]], list(range(SAMPLES)), 5000)
    report = compare_to_law(samples, markov_law(markov, [2], length, SAMPLING))
    assert not report.passed, str(report)


def test_pd_duplicate_candidates_fail(markov):
    length = 8
    config = _config(length, window=6, branching=3, tree_depth=1)
    samples = sample_engine(markov, DuplicateCandidatesPD(config.jacobi, "sjd_pac", "left"), config, [[2]], list(range(SAMPLES)), 5000)
    report = compare_to_law(samples, markov_law(markov, [2], length, SAMPLING))
    assert not report.passed, str(report)


@pytest.mark.parametrize(
    "init,expected_a,expected_b",
    [
        # row A: committed [1, 2, 3]; row B: committed [5] with one pending draft (2)
        ("left", [3, 4, 5, 5], [2, 2, 2, 4]),   # A: copy 3, forced 4, 4 is no image id -> random 5, copy 5
        ("above", [2, 4, 2, 5], [2, 5, 2, 4]),  # grid width 2: A copies 2, forced 4, copies 2, 4 -> random 5
    ],
)
def test_spatial_prior_fresh_drafts_on_hand_made_rows(init, expected_a, expected_b):
    """Fresh drafts copy the token 1 (left) / grid-width (above) places back, from the committed
    tokens or from earlier window slots, with a one-hot Q; a forced token wins; a copy that is not
    an allowed id falls back to the row's uniform draw, with Q uniform over the allowed ids."""
    from raydec.speculative.proposers.base import DecodeState
    from raydec.speculative.random import RowRandom

    vocab = 6
    allowed = torch.tensor([True, True, True, True, False, True])  # 4 only where forced (an end-of-row token)
    constraint = VocabConstraint(allowed=allowed, forced=lambda index: torch.where(index % 5 == 4, 4, -1))
    proposer = JacobiProposer(JacobiDraftConfig(window=4, init=init), "sjd", init, grid_width=2)
    pending_q = torch.tensor([[0.25, 0.25, 0.25, 0.25, 0.0, 0.0]], dtype=torch.float64)
    slots = proposer.spine_slots  # row 7 carries one draft (2) into the next window
    proposer.pending_rows = [7]
    proposer.pending_tokens = torch.tensor([[2] + [0] * (slots - 1)])
    proposer.pending_proposals = torch.cat([pending_q, torch.zeros(slots - 1, vocab, dtype=torch.float64)]).unsqueeze(0)
    proposer.pending_count = torch.tensor([1])
    state = DecodeState([3, 7], [[1, 2, 3], [5]], RowRandom.for_seeds([0, 0]), vocab, constraint, torch.float64)
    uniforms = torch.tensor([[0.5, 0.5, 0.9, 0.9], [0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)  # 0.9 -> id 5
    tokens, proposals = proposer._fill_window(state, uniforms)
    assert tokens.tolist() == [expected_a, expected_b]
    uniform_q = allowed.double() / allowed.sum()
    for row, expected in enumerate((expected_a, expected_b)):
        for slot, token in enumerate(expected):
            q = proposals[row, slot]
            if row == 1 and slot == 0:
                assert torch.equal(q, pending_q[0])  # a carried draft keeps its recorded Q
            elif row == 0 and slot == (2 if init == "left" else 3):
                assert torch.equal(q, uniform_q)  # the fallback draw
            else:
                assert torch.equal(q, torch.nn.functional.one_hot(torch.tensor(token), vocab).double())


def test_adaptive_continuation_couples_drafts_on_hand_made_slots():
    """AC keeps a slot's old draft when u < P(d) / Q(d) and otherwise draws from
    norm(max(0, P - Q)); plain SJD redraws every slot from P. Either way Q := P."""
    p = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]]], dtype=torch.float64)
    old_q = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.25] * 4, [0.25] * 4, [0.25] * 4]], dtype=torch.float64)
    old_tokens = torch.tensor([[0, 3, 0, 0]])
    # acceptance: 0.5, 1 (0.4 / 0.25 capped), 0.4, 0.4
    uniforms = torch.tensor([[[0.7, 0.5], [0.99, 0.5], [0.3, 0.5], [0.85, 0.8]]], dtype=torch.float64)
    ac = JacobiProposer(JacobiDraftConfig(window=4), "sjd_ac", "uniform")
    tokens, recorded = ac.couple(p, old_tokens, old_q, uniforms)
    # slot 0: rejected, the residual is all on token 1; slots 1, 2 keep; slot 3: residual [0, 0, .25, .75], u 0.8 -> 2
    assert tokens.tolist() == [[1, 3, 0, 2]]
    assert recorded is p
    sjd = JacobiProposer(JacobiDraftConfig(window=4), "sjd", "uniform")
    tokens, recorded = sjd.couple(p, old_tokens, old_q, uniforms)
    # fresh draws from P with u[..., 0]: the first token whose cumulative mass reaches 1 - u
    assert tokens.tolist() == [[0, 0, 3, 1]] and recorded is p
