"""Plain autoregressive decoding: the proposer that proposes nothing."""

from __future__ import annotations

from raydec.speculative.proposers.base import DecodeState, Proposer
from raydec.speculative.tree import DraftTree


class ARProposer(Proposer):
    """Window = the root only; every step commits exactly one token sampled from P."""

    admits_rows = True
    takes_over = True

    def admit(self, state: DecodeState, first_probs, prefill) -> None:
        pass  # no per-row state

    def take_over(self, state: DecodeState) -> None:
        pass  # no per-row state

    def propose(self, state: DecodeState) -> DraftTree:
        return DraftTree.roots_only(state.roots(), state.vocab_size, state.prob_dtype)
