"""``verify_tree`` itself against the exact law, at a sample size that sees small biases.

``test_verify.py`` proves, by exact enumeration (``output_law``), that the recursion's math
commits the target's law. This file checks that the batched code implements that math: one
random tree shape, 200,000 rows, each with its own draft tokens drawn from the tree's proposals
and its own uniforms, in one ``verify_tree`` call (the batched recursion, the chain pass and the
one-hot pass). The committed sequences must follow ``output_law`` (chi-square over every
sequence). A verifier that mixes a tenth of p into its residual, far too small a bias for the
model-level harness (20,000 samples), must fail it by a wide margin.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import raydec.speculative.verify as verify
from raydec.speculative.tree import DETERMINISTIC, DraftTree
from raydec.speculative.verify import output_law, verify_tree
from tests.lawtest import FALSE_ALARM_RATE, _chi2
from tests.core.test_verify import RandomProcess, _random_tree

torch.set_num_threads(1)

VOCAB = 4
ROWS = 200_000


def _rows_of(tree: DraftTree, rows: int, generator: torch.Generator) -> DraftTree:
    """``rows`` copies of a one-row tree shape, each node's token redrawn from its proposal
    (without replacement among the earlier siblings of its group when so marked)."""
    tokens = tree.tokens.expand(rows, -1).clone()
    drawn: dict[tuple[int, int], list[torch.Tensor]] = {}  # (parent, group) -> earlier siblings' tokens
    for node in range(1, tree.num_nodes):
        group = int(tree.proposal_index[0, node])
        if group == DETERMINISTIC:
            continue
        weights = tree.proposal_probs[0, group].expand(rows, -1).clone()
        key = (int(tree.parents[0, node]), group)
        if bool(tree.without_replacement[0, node]):
            for earlier in drawn.get(key, []):
                weights[torch.arange(rows), earlier] = 0.0
        tokens[:, node] = torch.multinomial(weights, 1, generator=generator).squeeze(1)
        drawn.setdefault(key, []).append(tokens[:, node])
    expand = lambda t: t.expand(rows, *t.shape[1:]).clone()  # noqa: E731
    return DraftTree(tokens, expand(tree.parents), expand(tree.valid), expand(tree.proposal_index),
                     expand(tree.without_replacement), expand(tree.proposal_probs))


def _target_probs(tree: DraftTree, process: RandomProcess) -> torch.Tensor:
    """[B, N, V]: the process's P after each node's path of tokens (root excluded)."""
    rows, width = tree.tokens.shape
    codes = torch.zeros(rows, width, dtype=torch.long)  # base-VOCAB code of the path
    lengths = [0] * width
    for node in range(1, width):
        parent = int(tree.parents[0, node])
        codes[:, node] = codes[:, parent] * VOCAB + tree.tokens[:, node]
        lengths[node] = lengths[parent] + 1
    probs = torch.empty(rows, width, VOCAB, dtype=torch.float64)
    for node in range(width):
        n = lengths[node]
        table = torch.stack([process(tuple(int(c) // VOCAB ** (n - 1 - i) % VOCAB for i in range(n)))
                             for c in range(VOCAB ** n)])
        probs[:, node] = table[codes[:, node]]
    return probs


def _committed_law_p_value(kind: str, seed: int, broken_residual=None) -> float:
    """p-value of the committed sequences of ROWS rows of one random tree against its exact law
    (computed with the honest math; ``broken_residual`` replaces the verifier's residual only)."""
    generator = torch.Generator().manual_seed(seed)
    shape = DraftTree.stack([_random_tree(generator, VOCAB, kind)], VOCAB, torch.float64)
    process = RandomProcess(VOCAB, seed=1000 + seed)
    law = output_law(shape, 0, process)  # exact, with the unpatched math
    tree = _rows_of(shape, ROWS, generator)
    uniforms = torch.rand(ROWS, tree.num_nodes, generator=generator, dtype=torch.float64)
    with pytest.MonkeyPatch.context() as patch:
        if broken_residual is not None:
            patch.setattr(verify, "residual", broken_residual)
        result = verify_tree(tree, _target_probs(tree, process), uniforms)
    path_tokens = torch.where(result.path >= 0, tree.tokens.gather(1, result.path.clamp(min=0)), -1).tolist()
    counts: dict[tuple[int, ...], int] = {}
    for path, accepted, token in zip(path_tokens, result.num_accepted.tolist(), result.next_token.tolist()):
        key = tuple(path[1:accepted + 1]) + (token,)
        counts[key] = counts.get(key, 0) + 1
    cells = sorted(set(law) | set(counts))
    observed = np.array([counts.get(c, 0) for c in cells], dtype=float)
    expected = np.array([law.get(c, 0.0) for c in cells])
    assert abs(expected.sum() - 1.0) < 1e-9
    return _chi2(observed, expected)


@pytest.mark.parametrize("kind", ["chain", "wr", "onehot", "mixed"])
def test_batched_verifier_commits_the_exact_law(kind):
    for seed in range(2):
        p_value = _committed_law_p_value(kind, seed)
        assert p_value >= FALSE_ALARM_RATE / 8, f"{kind} tree {seed}: p={p_value:.2e}"


@pytest.mark.parametrize("kind", ["chain", "wr", "mixed"])
def test_a_slightly_biased_residual_fails(kind):
    """One part p in ten mixed into the residual after a rejection: rejected far below 1e-3 / 8."""
    honest = verify.residual
    p_values = [_committed_law_p_value(kind, seed, lambda p, q: 0.9 * honest(p, q) + 0.1 * p) for seed in range(2)]
    assert min(p_values) < FALSE_ALARM_RATE / 8 * 1e-3, f"{kind}: p-values {p_values}"
