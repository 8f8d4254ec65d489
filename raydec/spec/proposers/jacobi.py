"""Speculative Jacobi decoding: SJD, SJD + Adaptive Continuation, SJD-PAC.

Teng et al. 2025 (SJD), Kang et al. 2026 (SJD-PAC). No draft model: the drafts for the slots
after the committed prefix come from the target's own (stale) predictions of the last forward.

Per row we keep *pending drafts* for the slots after the root: a token and the proposal ``Q``
it is distributed as (dense ``[V]``; one-hot for deterministic spatial-prior drafts).

    window = [root] + pending drafts + fresh drafts to fill L-1 slots
    (sjd_pac) the first ``tree_depth`` slots become a K-ary tree: candidate 0 is the pending
              draft, candidates 1..K-1 are drawn without replacement from the same Q
    after verification, for every untested slot j beyond the new root (on the spine):
      sjd     draft_j ~ P_{j-1}                       Q_j := P_{j-1}
      ac/pac  keep draft_j with prob min(1, P_{j-1}(d)/Q_j(d)), else ~ norm(max(0, P_{j-1} - Q_j))
              (maximal coupling: marginally P_{j-1})  Q_j := P_{j-1}   (always the new P)

Fresh drafts: a uniform random allowed token with Q = uniform over the allowed ids, or a
spatial prior (the token to the left / above in the image grid) with Q one-hot; forced layout
tokens (e.g. Emu3 end-of-line) are drafted as themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from raydec.config import DraftSpec
from raydec.spec.proposers.base import DecodeState, Proposer
from raydec.spec.sampling import sample_with_uniform
from raydec.spec.tree import DraftTree, TreeBuilder
from raydec.spec.verify import VerifyResult, acceptance_probability, residual

Variant = Literal["sjd", "sjd_ac", "sjd_pac"]
FreshInit = Literal["uniform", "left", "above"]


@dataclass
class PendingDrafts:
    """A row's drafts for the slots after its root. tokens: [n]; proposals: [n, V]."""

    tokens: list[int] = field(default_factory=list)
    proposals: list[torch.Tensor] = field(default_factory=list)


@dataclass
class WindowLayout:
    """Where the row's spine (slot j's main draft) sits in the tree it proposed last."""

    spine_nodes: list[int]          # spine_nodes[j] = node index of slot j (slot 0 = root)
    spine_tokens: list[int]
    spine_proposals: list[torch.Tensor]  # proposal of slot j (index 0 unused)


def _uniform(vocab: int, allowed: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    q = torch.ones(vocab, dtype=dtype) if allowed is None else allowed.to(dtype)
    return q / q.sum()


def _one_hot(token: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    q = torch.zeros(vocab, dtype=dtype)
    q[token] = 1.0
    return q


class JacobiProposer(Proposer):
    """SJD family proposer (see module docstring).

    draft.window:     L - 1 draft nodes per step
    draft.branching:  K candidates per tree level (sjd_pac)
    draft.tree_depth: number of tree levels after the root (D - 1 in the paper; sjd_pac)
    grid_width:       tokens per image row (for the "above" prior), row stride included
    """

    def __init__(self, draft: DraftSpec, variant: Variant = "sjd_pac", init: FreshInit = "uniform", grid_width: int | None = None) -> None:
        if init == "above" and not grid_width:
            raise ValueError("init='above' needs grid_width (tokens per image row)")
        self.draft = draft
        self.variant = variant
        spine = draft.window - self._tree_extra_nodes()
        if variant == "sjd_pac" and spine < draft.tree_depth:
            raise ValueError(
                f"draft: window={draft.window} cannot hold a {draft.branching}-ary tree of depth "
                f"{draft.tree_depth} ({draft.window - spine + draft.tree_depth} nodes) plus its spine"
            )
        self.init = init
        self.grid_width = grid_width
        self.pending: dict[int, PendingDrafts] = {}
        self.layouts: dict[int, WindowLayout] = {}

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, state: DecodeState, first_probs: torch.Tensor, prefill) -> None:
        self.pending = {row_id: PendingDrafts() for row_id in state.row_ids}
        self.layouts = {}

    def propose(self, state: DecodeState) -> DraftTree:
        builders = []
        for row, row_id in enumerate(state.row_ids):
            builders.append(self._propose_row(state, row, row_id))
        return DraftTree.stack(builders, state.vocab_size, state.prob_dtype)

    def observe(self, state: DecodeState, tree: DraftTree, target_probs: torch.Tensor, result: VerifyResult, output) -> None:
        for row, row_id in enumerate(state.row_ids):
            self.pending[row_id] = self._carry_over(state, row, row_id, target_probs[row], result)

    # -- drafting ------------------------------------------------------------------------------

    def _fresh(self, state: DecodeState, row: int, tokens_so_far: list[int], gen_index: int) -> tuple[int, torch.Tensor]:
        """A fresh draft for generated index ``gen_index`` given the tokens before it."""
        vocab, dtype = state.vocab_size, state.prob_dtype
        constraint = state.constraint
        if constraint is not None and constraint.forced is not None:
            forced = int(constraint.forced(torch.tensor([[gen_index]]))[0, 0])
            if forced >= 0:
                return forced, _one_hot(forced, vocab, dtype)
        source = {"left": gen_index - 1, "above": gen_index - (self.grid_width or 0)}.get(self.init, -1)
        if 0 <= source < len(tokens_so_far):
            token = tokens_so_far[source]
            allowed = None if constraint is None else constraint.allowed
            if allowed is None or bool(allowed[token]):
                return token, _one_hot(token, vocab, dtype)
        allowed = None if constraint is None else constraint.allowed
        q = _uniform(vocab, allowed, dtype)
        u = torch.rand(1, generator=state.generators[row], dtype=torch.float64)
        return int(sample_with_uniform(q, u[0])), q

    def _propose_row(self, state: DecodeState, row: int, row_id: int) -> TreeBuilder:
        generated = state.generated[row]
        pending = self.pending.get(row_id, PendingDrafts())
        slots = self.draft.window - self._tree_extra_nodes()
        tokens, proposals = list(pending.tokens[:slots]), list(pending.proposals[:slots])
        known = list(generated) + tokens  # tokens at generated indices 0.. (drafts included)
        while len(tokens) < slots:
            token, q = self._fresh(state, row, known, len(known))
            tokens.append(token)
            proposals.append(q)
            known.append(token)

        builder = TreeBuilder(generated[-1])
        spine_nodes, node = [0], 0
        depth = self.draft.tree_depth if self.variant == "sjd_pac" else 0
        frontier = [0]
        for level in range(min(depth, len(tokens))):
            q = proposals[level]
            group = builder.add_proposal(q)
            candidates = [tokens[level]] + self._extra_candidates(state, row, q, tokens[level])
            wr = len(candidates) > 1
            next_frontier = []
            for parent in frontier:
                children = [builder.add(parent, c, group, without_replacement=wr) for c in candidates]
                if parent == spine_nodes[-1]:
                    spine_child = children[0]
                next_frontier += children
            spine_nodes.append(spine_child)
            frontier = next_frontier
        for level in range(len(spine_nodes) - 1, len(tokens)):
            group = builder.add_proposal(proposals[level])
            spine_nodes.append(builder.add(spine_nodes[-1], tokens[level], group))
        self.layouts[row_id] = WindowLayout(spine_nodes, [generated[-1]] + tokens, [proposals[0]] + proposals if proposals else [])
        return builder

    def _tree_extra_nodes(self) -> int:
        """Non-spine nodes the tree adds, so that the total stays at ``window`` draft nodes."""
        if getattr(self, "variant", None) != "sjd_pac" or self.draft.tree_depth == 0:
            return 0
        k, depth = self.draft.branching, self.draft.tree_depth
        return sum(k**level for level in range(1, depth + 1)) - depth

    def _extra_candidates(self, state: DecodeState, row: int, q: torch.Tensor, first: int) -> list[int]:
        """K - 1 more tokens without replacement from q, excluding ``first``."""
        weights = q.clone().to(torch.float64)
        weights[first] = 0.0
        count = min(self.draft.branching - 1, int((weights > 0).sum()))
        if count <= 0:
            return []
        uniforms = torch.rand(self.draft.branching - 1, generator=state.generators[row], dtype=torch.float64)
        picks = []
        for k in range(count):
            token = int(sample_with_uniform(weights, uniforms[k]))
            picks.append(token)
            weights[token] = 0.0
        return picks

    # -- carry-over ----------------------------------------------------------------------------

    def _carry_over(self, state: DecodeState, row: int, row_id: int, probs: torch.Tensor, result: VerifyResult) -> PendingDrafts:
        """Pending drafts for the next window. probs: [N, V] this row's P at every node."""
        layout = self.layouts[row_id]
        new_root_slot = int(result.num_accepted[row]) + 1
        carried = PendingDrafts()
        last_slot = len(layout.spine_nodes) - 1
        slots = list(range(new_root_slot + 1, last_slot + 1))
        if not slots:
            return carried
        generator = state.generators[row]
        uniforms = torch.rand(2 * len(slots), generator=generator, dtype=torch.float64)
        for i, slot in enumerate(slots):
            p = probs[layout.spine_nodes[slot - 1]].unsqueeze(0)       # P_{j-1}: [1, V]
            old_token = layout.spine_tokens[slot]
            old_q = layout.spine_proposals[slot].to(p.dtype).unsqueeze(0)
            if self.variant == "sjd":
                token = int(sample_with_uniform(p[0], uniforms[2 * i]))
            else:
                keep = float(acceptance_probability(p, old_q, torch.tensor([old_token])))
                if float(uniforms[2 * i]) < keep:
                    token = old_token
                else:
                    token = int(sample_with_uniform(residual(p, old_q)[0], uniforms[2 * i + 1]))
            carried.tokens.append(token)
            carried.proposals.append(p[0].clone())  # Q := the current prediction, always
        return carried
