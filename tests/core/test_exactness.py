"""The exactness harness: the engine's output law equals plain AR sampling.

Toy targets with computable laws (a random Markov chain; a tiny random LlamaForCausalLM in
float64, vocabulary 8), >= 20,000 samples per configuration (5,000 for the batch-1 and
ragged-batch paths, tests/lawtest.py's PATH_SAMPLES), chi-square on every marginal and
pairwise joint at a fixed family-wise false-alarm rate (tests/lawtest.py). The same harness
rejects three deliberately broken verifiers (tests/broken.py).

Its power is limited by the sample size: at 20,000 samples it sees deviations of about 0.03 in
total variation, so a verifier that mixes a quarter of p into its residual can pass here. The
verifier itself is tested at ten times the sample size in tests/core/test_verify_law.py, where
mixing in a tenth of p fails by hundreds of orders of magnitude (and 3% still fails); this file
checks what only a whole engine can get wrong (proposals reported honestly, caches, batching).
"""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.causal_lm import CfgPrompt
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.ar import ARProposer
from tests.proposers import RandomTreeProposer
from raydec.speculative.sampling import VocabConstraint
from tests.broken import batch_minimum_verifier, longest_path_verifier, stale_proposal_verifier
from tests.lawtest import PATH_SAMPLES, SAMPLES, compare_to_law, sample_engine
from tests.toys import FixedCandidatesProposer, forked_markov, lm_law, markov_law, random_markov

torch.set_num_threads(1)  # tiny tensors: threads only add synchronisation cost

LENGTH = 4


@pytest.fixture(scope="module")
def markov():
    return random_markov(vocab=6, seed=3)


def _config(sampling: SamplingConfig, **draft) -> DecodeConfig:
    return DecodeConfig(max_new_tokens=LENGTH, sampling=sampling, jacobi=JacobiDraftConfig(**draft), compaction="always")


SAMPLING = SamplingConfig(temperature=1.0)


@pytest.mark.parametrize("mode", ["dense", "onehot"])
def test_markov_chain_proposals(markov, mode):
    config = _config(SAMPLING, window=3)
    samples = sample_engine(markov, RandomTreeProposer(config.jacobi, mode), config, [[2]], list(range(SAMPLES)), 5000)
    report = compare_to_law(samples, markov_law(markov, [2], LENGTH, SAMPLING))
    assert report.passed, str(report)


def test_markov_batch_one(markov):
    """5,000 separate batch-1 generate calls."""
    config = _config(SAMPLING, window=3)
    samples = sample_engine(markov, RandomTreeProposer(config.jacobi, "dense"), config, [[1]], list(range(PATH_SAMPLES)), 1)
    report = compare_to_law(samples, markov_law(markov, [1], LENGTH, SAMPLING))
    assert report.passed, str(report)


def test_markov_batch_four_ragged(markov):
    """Batch 4, prompts of lengths 1..4 (same last token, so one law), rows with different caps."""
    config = _config(SAMPLING, window=3)
    engine = Engine(markov, RandomTreeProposer(config.jacobi, "dense"), config.sampling, config.max_new_tokens, compaction=config.compaction)
    prompts = [[4], [0, 4], [5, 5, 4], [1, 2, 3, 4]]
    caps = [LENGTH, LENGTH - 1, LENGTH, LENGTH - 2]
    rows = []
    for call in range(PATH_SAMPLES // 4):
        outs = engine.generate([RowRequest(prompts[i], seed=4 * call + i, max_new_tokens=caps[i]) for i in range(4)])
        assert [len(o.tokens) for o in outs] == caps
        rows += [o.tokens[: LENGTH - 2] for o in outs]
    law = markov_law(markov, [4], LENGTH - 2, SAMPLING)
    report = compare_to_law(torch.tensor(rows), law)
    assert report.passed, str(report)


def test_llama_multicandidate_tree_without_replacement(llama):
    config = _config(SAMPLING, window=7, branching=2, tree_depth=2)
    proposer = RandomTreeProposer(config.jacobi, "dense", sharpness=3.0)
    samples = sample_engine(llama, proposer, config, [[3, 1, 4]], list(range(SAMPLES)), 5000)
    report = compare_to_law(samples, lm_law(llama, [3, 1, 4], LENGTH, SAMPLING))
    assert report.passed, str(report)


def test_llama_cfg_topk_and_vocab_constraint(llama):
    sampling = SamplingConfig(temperature=1.0, top_k=4, cfg_scale=3.0)
    allowed = torch.tensor([True] * 7 + [False])
    constraint = VocabConstraint(allowed=allowed)
    config = _config(sampling, window=4, branching=2, tree_depth=1)
    prompt = CfgPrompt(cond=[5, 2, 6], uncond=[0])
    proposer = RandomTreeProposer(config.jacobi, "dense", sharpness=3.0)
    samples = sample_engine(llama, proposer, config, [prompt], list(range(SAMPLES)), 5000, constraint=constraint)
    report = compare_to_law(samples, lm_law(llama, prompt, LENGTH, sampling, constraint))
    assert report.passed, str(report)
    assert not bool((samples == 7).any()), "a disallowed token was sampled"


def test_ar_proposer_matches_law(llama):
    config = _config(SAMPLING)
    samples = sample_engine(llama, ARProposer(), config, [[7, 7]], list(range(SAMPLES)), 10000)
    report = compare_to_law(samples, lm_law(llama, [7, 7], LENGTH, SAMPLING))
    assert report.passed, str(report)


# ------------------------------------------------------------------------------------------
# Broken variants must fail the same harness


@pytest.mark.parametrize("verifier,lossless", [(None, True), (longest_path_verifier, False)])
def test_fixed_candidate_trees(verifier, lossless):
    """Deterministic sibling drafts [1, 0] in a depth-3 tree on a forked chain: the real
    verifier is exact; preferring the longest accepted path is not."""
    target = forked_markov()
    config = _config(SAMPLING, window=14, branching=2, tree_depth=3)
    proposer = FixedCandidatesProposer([1, 0], depth=3)
    samples = sample_engine(target, proposer, config, [[0]], list(range(SAMPLES)), 5000, verifier=verifier)
    report = compare_to_law(samples, markov_law(target, [0], LENGTH, SAMPLING))
    assert report.passed is lossless, str(report)


def test_outdated_proposal_fails(llama):
    config = _config(SAMPLING, window=3, branching=3, tree_depth=1)
    proposer = RandomTreeProposer(config.jacobi, "dense", sharpness=3.0)
    samples = sample_engine(llama, proposer, config, [[3, 1, 4]], list(range(SAMPLES)), 5000, verifier=stale_proposal_verifier)
    report = compare_to_law(samples, lm_law(llama, [3, 1, 4], LENGTH, SAMPLING))
    assert not report.passed, str(report)


def test_batch_minimum_commit_fails(llama):
    config = _config(SAMPLING, window=3)
    proposer = RandomTreeProposer(config.jacobi, "dense", sharpness=3.0)
    samples = sample_engine(llama, proposer, config, [[3, 1, 4]], list(range(SAMPLES)), 16, verifier=batch_minimum_verifier)
    report = compare_to_law(samples, lm_law(llama, [3, 1, 4], LENGTH, SAMPLING))
    assert not report.passed, str(report)
