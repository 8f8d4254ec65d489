"""A proposer that drafts at random: the workhorse of the exactness harness.

It knows nothing about the target, so any acceptance it gets is luck, but every draft is
reported honestly: a dense ``q`` the token was drawn from, or one-hot for "deterministic"
drafts (a token fixed before verification, whatever private randomness chose it). Tree shape:
a full ``branching``-ary tree of ``tree_depth`` levels (siblings drawn without replacement
from one shared ``q``), then a chain under the first-candidate spine up to ``window`` nodes.
"""

from __future__ import annotations

from typing import Literal

import torch

from raydec.config import DraftSpec
from raydec.spec.proposers.base import DecodeState, Proposer
from raydec.spec.tree import DETERMINISTIC, DraftTree, TreeBuilder


def tree_node_count(branching: int, depth: int) -> int:
    """Draft nodes in a full ``branching``-ary tree of ``depth`` levels (root excluded)."""
    return sum(branching**level for level in range(1, depth + 1))


def sample_without_replacement(q: torch.Tensor, count: int, generator: torch.Generator) -> list[int]:
    """``count`` distinct tokens, each drawn from q renormalised over the tokens not yet taken."""
    weights = q.clone().to(torch.float64)
    picks: list[int] = []
    for _ in range(min(count, int((weights > 0).sum()))):
        token = int(torch.multinomial(weights, 1, generator=generator))
        picks.append(token)
        weights[token] = 0.0
    return picks


class RandomTreeProposer(Proposer):
    """Random drafts with honest proposals (see module docstring).

    mode: "dense"   -> tokens ~ a random q, reported as that q
          "onehot"  -> tokens uniform over allowed ids, reported as deterministic
    sharpness: scale of the random logits behind q (higher = more concentrated q)
    """

    def __init__(self, draft: DraftSpec, mode: Literal["dense", "onehot"] = "dense", sharpness: float = 2.0) -> None:
        if tree_node_count(draft.branching, draft.tree_depth) > draft.window:
            raise ValueError(
                f"draft: a {draft.branching}-ary tree of depth {draft.tree_depth} needs "
                f"{tree_node_count(draft.branching, draft.tree_depth)} nodes > window={draft.window}"
            )
        self.draft = draft
        self.mode = mode
        self.sharpness = sharpness

    def _random_q(self, state: DecodeState, generator: torch.Generator) -> torch.Tensor:
        logits = torch.randn(state.vocab_size, generator=generator, dtype=torch.float64) * self.sharpness
        if state.constraint is not None and state.constraint.allowed is not None:
            logits = logits.masked_fill(~state.constraint.allowed, float("-inf"))
        return torch.softmax(logits, dim=-1)

    def _children(self, builder: TreeBuilder, parent: int, count: int, state: DecodeState, generator: torch.Generator) -> list[int]:
        q = self._random_q(state, generator)
        if self.mode == "onehot":
            allowed = (q > 0).nonzero().flatten()
            picks = allowed[torch.randint(len(allowed), (count,), generator=generator)].tolist()
            return [builder.add(parent, token) for token in picks]
        group = builder.add_proposal(q.to(state.prob_dtype))
        tokens = sample_without_replacement(q, count, generator)
        return [builder.add(parent, token, group, without_replacement=count > 1) for token in tokens]

    def propose(self, state: DecodeState) -> DraftTree:
        builders = []
        for row in range(state.batch_size):
            generator = state.generators[row]
            builder = TreeBuilder(state.generated[row][-1])
            frontier, spine = [0], 0
            for _ in range(self.draft.tree_depth):
                next_frontier = []
                for node in frontier:
                    children = self._children(builder, node, self.draft.branching, state, generator)
                    if node == spine and children:
                        next_spine = children[0]
                    next_frontier += children
                frontier, spine = next_frontier, next_spine
            while builder.num_nodes - 1 < self.draft.window:
                spine = self._children(builder, spine, 1, state, generator)[0]
            builders.append(builder)
        return DraftTree.stack(builders, state.vocab_size, state.prob_dtype)


class OracleProposer(Proposer):
    """Drafts = a known continuation (e.g. the greedy AR output), one-hot, as a chain.

    Measures the engine's ceiling: with the right drafts at temperature 0 every draft is
    accepted, so tokens per forward approaches window + 1.
    """

    def __init__(self, window: int, references: dict[int, list[int]]) -> None:
        self.window = window
        self.references = references

    def propose(self, state: DecodeState) -> DraftTree:
        builders = []
        for row, row_id in enumerate(state.row_ids):
            done = state.generated[row]
            builder = TreeBuilder(done[-1])
            reference = self.references.get(row_id, [])
            builder.add_chain(0, reference[len(done) : len(done) + self.window])
            builders.append(builder)
        return DraftTree.stack(builders, state.vocab_size, state.prob_dtype)


__all__ = ["RandomTreeProposer", "OracleProposer", "tree_node_count", "sample_without_replacement", "DETERMINISTIC"]
