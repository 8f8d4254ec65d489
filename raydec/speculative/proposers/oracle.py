"""A proposer that drafts a known continuation: the engine's ceiling, for benches."""

from __future__ import annotations

from raydec.speculative.proposers.base import DecodeState, Proposer
from raydec.speculative.tree import DraftTree, TreeBuilder


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
        for row, row_id in enumerate(state.row_handles):
            done = state.generated[row]
            builder = TreeBuilder(done[-1])
            reference = self.references.get(row_id, [])
            builder.add_chain(0, reference[len(done) : len(done) + self.window])
            builders.append(builder)
        return DraftTree.stack(builders, state.vocab_size, state.prob_dtype)
