"""Speculative Jacobi decoding: SJD, SJD + Adaptive Continuation, SJD-PAC.

Teng et al. 2025 (SJD), Kang et al. 2026 (SJD-PAC). No draft model: the drafts for the slots
after the committed prefix come from the target's own (stale) predictions of the last forward.

Per row we keep *pending drafts* for the slots after the root: a token and the proposal ``Q``
it is distributed as (dense ``[V]``; one-hot for deterministic spatial-prior drafts).

    window = [root] + pending drafts + fresh drafts, S spine slots
    (sjd_pac) slots 1..D become a K-ary tree: candidate 0 is the slot's draft, candidates
              1..K-1 are drawn without replacement from the same Q; the spine continues as a chain
    after verification, for every untested slot j beyond the new root (on the spine):
      sjd     draft_j ~ P_{j-1}                       Q_j := P_{j-1}
      ac/pac  keep draft_j with prob min(1, P_{j-1}(d)/Q_j(d)), else ~ norm(max(0, P_{j-1} - Q_j))
              (maximal coupling: marginally P_{j-1})  Q_j := P_{j-1}   (always the new P)
      gumbel  (a row in coupling "gumbel", any variant) draft_j = argmax(log P_{j-1} + G_j), Q_j := P_{j-1},
              with G_j = -log E_j the row's noise at slot j's generated position (``RowRandom.exponentials``): the
              target's own sample there whenever P_j = P_{j-1}; a tree level's K candidates are the
              Gumbel top-K list of log Q_j + G_j (``gumbel_list``), a fresh slot the Gumbel-max of the
              uniform Q

Fresh drafts (``fresh_drafts``): a uniform random allowed token with Q = uniform over the
allowed ids, or a spatial prior (the token to the left / above in the image grid) with Q one-hot;
forced layout tokens (e.g. Emu3 end-of-line) are drafted as themselves. Which prior pays depends
on the model's images: the bench's cost-model tuner (``raydec.bench.cost_tuner.choose_fresh_drafts``)
counts forwards to pick one.

Everything is batched tensor work on the target's device: pending drafts are [B, S] / [B, S, V]
tensors aligned with the batch, and each row's uniforms come from its own counter-based
stream, so its output never depends on the other rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from raydec.config import JacobiDraftConfig, full_tree_nodes
from raydec.speculative import random as streams
from raydec.speculative.buffers import KeptBuffer
from raydec.speculative.capture import StepGraph
from raydec.speculative.proposers.base import DecodeState, Proposer
from raydec.speculative.proposers.fresh_drafts import fill_window
from raydec.speculative.random import counter_uniforms
from raydec.speculative.sampling import sample_with_uniform
from raydec.speculative.tree import DraftTree, identity_mask
from raydec.speculative.verify import VerifyResult, acceptance_probability, coupled_tokens, residual_weights

logger = logging.getLogger(__name__)

Variant = Literal["sjd", "sjd_ac", "sjd_pac"]
FreshInit = Literal["uniform", "left", "above"]


@dataclass
class TreeLayout:
    """The fixed node layout of one step (same for every row; missing candidates are invalid).

    parents: [N] parent node; slot: [N] spine slot (= depth) of each node; level_rank: [N]
    candidate rank within its level (0 = the slot's own draft); spine: [S + 1] spine node of
    each slot (slot 0 = root); level_path: [N, D] candidate rank at each tree level on the
    node's path (-1 beyond its depth), to decide which nodes exist; level_nodes: per tree
    level, its nodes [n_l].
    """

    parents: torch.Tensor
    slot: torch.Tensor
    level_rank: torch.Tensor
    spine: torch.Tensor
    level_path: torch.Tensor
    level_nodes: list[torch.Tensor] = field(default_factory=list)

    def to(self, device: torch.device) -> "TreeLayout":
        return TreeLayout(*(t.to(device) for t in (self.parents, self.slot, self.level_rank, self.spine, self.level_path)),
                          [t.to(device) for t in self.level_nodes])


def build_layout(spine_slots: int, branching: int, tree_depth: int) -> TreeLayout:
    """Full ``branching``-ary tree over slots 1..tree_depth, then the spine as a chain."""
    parents, slots, ranks, paths = [-1], [0], [0], [[-1] * tree_depth]
    spine = [0]
    frontier = [0]
    for level in range(tree_depth):
        next_frontier = []
        for node in frontier:
            for rank in range(branching):
                parents.append(node)
                slots.append(level + 1)
                ranks.append(rank)
                path = list(paths[node])
                path[level] = rank
                paths.append(path)
                next_frontier.append(len(parents) - 1)
                if node == spine[-1] and rank == 0:
                    spine_child = len(parents) - 1
        spine.append(spine_child)
        frontier = next_frontier
    for slot in range(tree_depth + 1, spine_slots + 1):
        parents.append(spine[-1])
        slots.append(slot)
        ranks.append(0)
        paths.append([0] * tree_depth)
        spine.append(len(parents) - 1)
    slot = torch.tensor(slots)
    return TreeLayout(
        parents=torch.tensor(parents), slot=slot, level_rank=torch.tensor(ranks),
        spine=torch.tensor(spine), level_path=torch.tensor(paths, dtype=torch.long).view(len(parents), tree_depth),
        level_nodes=[(slot == level + 1).nonzero().flatten() for level in range(tree_depth)],
    )


class JacobiProposer(Proposer):
    """SJD family proposer (see module docstring).

    jacobi.window:     L - 1 draft nodes per step (tree included)
    jacobi.branching:  K candidates per tree level (sjd_pac)
    jacobi.tree_depth: number of tree levels after the root (D - 1 in the paper; sjd_pac)
    grid_width:        tokens per image row in generation order (for the "above" prior)
    """

    def __init__(self, jacobi: JacobiDraftConfig, variant: Variant = "sjd_pac", init: FreshInit = "uniform", grid_width: int | None = None) -> None:
        if init == "above" and not grid_width:
            raise ValueError("init='above' needs grid_width (tokens per image row)")
        self.jacobi = jacobi
        self.variant = variant
        self.init = init
        self.grid_width = grid_width
        self.depth = jacobi.tree_depth if variant == "sjd_pac" else 0
        self.branching = jacobi.branching if self.depth else 1
        if variant == "sjd_pac" and (self.depth == 0 or self.branching == 1):
            # a chain on purpose (the tuner tries them: SJD-PAC's search holds SJD-AC's) or half a tree
            chosen = jacobi.branching == 1 and jacobi.tree_depth == 0
            logger.log(
                logging.DEBUG if chosen else logging.WARNING,
                "sjd_pac with draft.branching=%d, draft.tree_depth=%d has no proactive tree: it runs as sjd_ac "
                "(set both, e.g. branching=3, tree_depth=1, or tune them with the bench's cost-model tuner, "
                "raydec.bench.cost_tuner.tune_draft)",
                jacobi.branching, jacobi.tree_depth,
            )
        extra = full_tree_nodes(self.branching, self.depth) - self.depth
        self.spine_slots = jacobi.window - extra
        if self.spine_slots < max(1, self.depth):
            raise ValueError(
                f"draft: window={jacobi.window} cannot hold a {self.branching}-ary tree of depth "
                f"{self.depth} ({extra + self.depth} nodes) plus its spine"
            )
        self.layout = build_layout(self.spine_slots, self.branching, self.depth)
        width = len(self.layout.parents)
        # the layout's ancestor mask [N, N]; a row's missing nodes see only themselves
        self._layout_ancestors = DraftTree(
            torch.zeros(1, width, dtype=torch.long), self.layout.parents.unsqueeze(0), torch.ones(1, width, dtype=torch.bool),
            torch.zeros(1, width, dtype=torch.long), torch.zeros(1, width, dtype=torch.bool), torch.zeros(1, 0, 1),
        ).ancestor_mask()[0]
        self._eye = identity_mask(width)
        parents = self.layout.spine[:-1]  # the node whose P predicts each spine slot (a slice if they run in order)
        contiguous = bool((parents == torch.arange(int(parents[0]), int(parents[0]) + len(parents))).all())
        self._spine_parents = slice(int(parents[0]), int(parents[0]) + len(parents)) if contiguous else parents
        # pending drafts of the rows in ``pending_rows`` (batch order): tokens [B, S], their Q
        # [B, S, V], and how many of the S slots hold one [B] (the rest are fresh next step)
        self.pending_rows: list[int] = []
        self.pending_tokens: torch.Tensor | None = None
        self.pending_proposals: torch.Tensor | None = None
        self.pending_count: torch.Tensor | None = None
        self._last: dict[str, torch.Tensor] = {}
        self._on_device: dict = {}  # per device: the layout tensors there
        self._spine_buffer = KeptBuffer()  # P at the spine's parents, within one ``observe``
        self.capture(False, torch.device("cpu"))  # ``_window`` and ``_carry`` eager until an engine says otherwise

    # -- lifecycle -----------------------------------------------------------------------------

    admits_rows = True
    takes_over = True

    def start(self, state: DecodeState, first_probs: torch.Tensor, prefill) -> None:
        self.pending_rows, self.pending_tokens, self.pending_proposals, self.pending_count = [], None, None, None

    def take_over(self, state: DecodeState) -> None:
        self.start(state, None, None)  # its per-row state is its pending drafts: the rows' next window is all fresh drafts

    def admit(self, state: DecodeState, first_probs: torch.Tensor, prefill) -> None:
        pass  # a new row has no pending drafts: its first window is all fresh drafts

    def _device_layout(self, device: torch.device) -> tuple[TreeLayout, torch.Tensor, torch.Tensor, "slice | torch.Tensor"]:
        """The layout, its ancestor mask, the identity and the spine's parents, on ``device``."""
        if device not in self._on_device:
            spine = self._spine_parents if isinstance(self._spine_parents, slice) else self._spine_parents.to(device)
            self._on_device[device] = (self.layout.to(device), self._layout_ancestors.to(device), self._eye.to(device), spine)
        return self._on_device[device]

    def capture(self, enabled: bool, device: torch.device) -> None:
        self.captured = enabled
        facts = (self.variant, self.depth, self.branching)  # what ``_window`` and ``_carry`` read of the proposer
        self._window_graph = StepGraph(self._window, "jacobi_window", enabled, device, key=facts)
        self._carry_graph = StepGraph(self._carry, "jacobi_carry", enabled, device, key=facts)

    def step_graphs(self) -> tuple[StepGraph, ...]:
        return self._window_graph, self._carry_graph

    def propose(self, state: DecodeState) -> DraftTree:
        batch, device = state.batch_size, state.device
        layout, layout_ancestors, eye, _ = self._device_layout(device)
        allowed, allowed_ids, uniform_q = self._allowed(state)
        forced = state.constraint.forced if state.constraint is not None else None
        noise = self._noise(state)
        node_tokens, parents, valid, proposal_index, without_replacement, proposals, node_slot, ancestors, tokens, raw = self._window_graph(
            batch, (*self._window_inputs(state), state.roots(), state.random.seeds, state.random.steps, noise, state.random.flags()),
            (allowed, allowed_ids, uniform_q, layout.parents, layout.slot, layout.level_rank, layout.level_path,
             tuple(layout.level_nodes), layout_ancestors, eye),
            forced=forced, dtype=state.prob_dtype, coupling=state.coupling,
        )
        self._last = {"tokens": tokens, "proposals": raw, "noise": noise}
        tree = DraftTree(
            node_tokens, parents, valid, proposal_index, without_replacement, proposals,
            max_children=self.branching if self.depth else 1, any_without_replacement=bool(self.depth and self.branching > 1),
            branch_nodes=sum(self.branching**level for level in range(self.depth)) if self.branching > 1 else 0,
            levels=self.spine_slots,
        )
        return tree.with_structure(node_slot, ancestors)

    def _noise(self, state: DecodeState) -> torch.Tensor:
        """The coupled rows' noise E at the window's slots: [B, S, V] float64 (slot s + 1 drafts
        generated position ``positions + s``); [B, 0, 0] when no row is coupled."""
        if state.coupling == "rejection":
            return torch.zeros(state.batch_size, 0, 0, dtype=torch.float64, device=state.device)
        return state.random.exponentials(torch.arange(self.spine_slots), state.vocab_size)

    def _window(
        self, pending_tokens: torch.Tensor, pending_q: torch.Tensor, have: torch.Tensor, lengths: torch.Tensor, tail: torch.Tensor,
        roots: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, noise: torch.Tensor, coupled: torch.Tensor,
        allowed: torch.Tensor, allowed_ids: torch.Tensor, uniform_q: torch.Tensor, layout_parents: torch.Tensor, layout_slot: torch.Tensor,
        level_rank: torch.Tensor, level_path: torch.Tensor, level_nodes: tuple[torch.Tensor, ...], layout_ancestors: torch.Tensor,
        eye: torch.Tensor, *, forced: Callable | None, dtype: torch.dtype, coupling: str = "rejection",
    ) -> tuple[torch.Tensor, ...]:
        """One window from the pending drafts, on tensors alone (the proposer's captured function).

        pending_tokens [B, S], pending_q [B, S, V], have [B], lengths [B], tail [B, offset]
        (``_window_inputs``); roots, seeds, steps [B]; noise [B, S, V] (``_noise``) and
        coupled [B] bool: the coupled rows draw fresh drafts and tree candidates by Gumbel-max
        with their noise; the layout's tensors and the allowed ids
        -> the tree's tensors (tokens, parents, valid, proposal index, without replacement,
           proposals, depth [B, N], ancestors [B, N, N]) and the window's drafts [B, S] and Q [B, S, V]
        """
        batch, slots = pending_tokens.shape
        uniforms = counter_uniforms(seeds, steps, streams.JACOBI_FILL, slots + self.depth * self.branching)
        draws = None
        if coupling != "rejection":  # Gumbel-max from the uniform Q over the allowed ids: the least E among them
            draws = noise.masked_fill(~allowed, float("inf")).argmin(dim=-1)
            if coupling == "mixed":
                draws = torch.where(coupled.unsqueeze(1), draws, allowed_ids[(uniforms[:, :slots] * len(allowed_ids)).long().clamp(max=len(allowed_ids) - 1)])
        tokens, proposals = fill_window(pending_tokens, pending_q, have, lengths, tail, uniforms[:, :slots], allowed, allowed_ids,
                                        uniform_q, forced=forced, in_place=not self.captured, draws=draws)
        device = tokens.device
        width = layout_parents.shape[0]
        node_tokens = torch.zeros(batch, width, dtype=torch.long, device=device)
        node_tokens[:, 0] = roots
        valid = torch.ones(batch, width, dtype=torch.bool, device=device)
        node_slot = layout_slot.expand(batch, width)
        # spine / chain nodes carry the slot's draft
        node_tokens[:, 1:] = tokens.gather(1, (node_slot[:, 1:] - 1))
        for level in range(self.depth):
            draws = uniforms[:, slots + level * self.branching : slots + (level + 1) * self.branching - 1]
            extra, extra_valid = self.extra_candidates(proposals[:, level], tokens[:, level], draws) if coupling != "gumbel" else (None, None)
            if coupling != "rejection":
                listed, listed_valid = gumbel_list(proposals[:, level], tokens[:, level], noise[:, level], self.branching - 1)
                extra = listed if extra is None else torch.where(coupled.unsqueeze(1), listed, extra)
                extra_valid = listed_valid if extra_valid is None else torch.where(coupled.unsqueeze(1), listed_valid, extra_valid)
            candidates = torch.cat([tokens[:, level : level + 1], extra], dim=1)            # [B, K]
            candidate_valid = torch.cat([torch.ones(batch, 1, dtype=torch.bool, device=device), extra_valid], dim=1)
            at_level = level_nodes[level]
            ranks = level_rank[at_level]
            node_tokens[:, at_level] = candidates[:, ranks]
            # a node exists iff every candidate on its path exists
            on_path = level_path[:, level]                                                  # [N]
            uses = on_path >= 0
            exists = candidate_valid[:, on_path.clamp(min=0)]
            valid &= exists | ~uses
        proposal_index = (layout_slot - 1).clamp(min=-1).expand(batch, width).clone()
        proposal_index[:, 0] = -1
        without_replacement = ((layout_slot >= 1) & (layout_slot <= self.depth) & (self.branching > 1)).expand(batch, width).clone()
        parents = layout_parents.expand(batch, width).clone()
        parents[~valid] = -1
        ancestors = torch.where(valid.unsqueeze(2), layout_ancestors, eye)  # a node exists only with its ancestors
        return (node_tokens, parents, valid, proposal_index, without_replacement, proposals.to(dtype), node_slot * valid, ancestors,
                tokens, proposals)

    def observe(self, state: DecodeState, tree: DraftTree, target_probs: torch.Tensor, result: VerifyResult, output) -> None:
        """Carry the untested spine slots over to the next window (see module docstring)."""
        spine = self._device_layout(target_probs.device)[3]
        spine_range = (spine.start, spine.stop) if isinstance(spine, slice) else None
        self.pending_tokens, self.pending_proposals, self.pending_count = self._carry_graph(
            state.batch_size, (target_probs, self._last["tokens"], self._last["proposals"], result.num_accepted,
                               state.random.seeds, state.random.steps, self._last["noise"], state.random.flags()),
            (spine if spine_range is None else None,), spine_range=spine_range, coupling=state.coupling,
        )
        self.pending_rows = list(state.row_handles)
        self._last = {}

    def _carry(
        self, target_probs: torch.Tensor, last_tokens: torch.Tensor, last_q: torch.Tensor, num_accepted: torch.Tensor,
        seeds: torch.Tensor, steps: torch.Tensor, noise: torch.Tensor, coupled: torch.Tensor, spine: torch.Tensor | None,
        *, spine_range: tuple[int, int] | None, coupling: str = "rejection",
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next window's pending drafts on tensors alone (the proposer's captured function).

        target_probs [B, N, V]; the window's drafts [B, S] and their Q [B, S, V] (spent: written
        over when eager); num_accepted, seeds, steps [B]; noise [B, S, V] and coupled [B]: the
        window's noise (``_noise``) and the rows it couples; the spine's parents as a range or
        index [S] -> pending tokens [B, S], their Q [B, S, V], how many are real [B]
        """
        batch, slots = last_tokens.shape
        uniforms = counter_uniforms(seeds, steps, streams.JACOBI_CARRY, 2 * slots).view(batch, slots, 2)
        if spine_range is not None:
            p = target_probs[:, spine_range[0] : spine_range[1]]  # P_{j-1}: [B, S, V]
        else:
            p = self._spine_probs(target_probs, spine) if not self.captured else target_probs.index_select(1, spine)
        spent = last_q.to(p.dtype)
        if self.captured:
            spent = spent.clone()  # a graph's input stays as it was
        if coupling == "gumbel":  # every slot's new draft is P_{j-1}'s Gumbel-max sample: Q := P_{j-1}
            tokens, recorded = coupled_tokens(p, noise), p
        else:
            tokens, recorded = self.couple(p, last_tokens, spent, uniforms)
            if coupling == "mixed":
                tokens = torch.where(coupled.unsqueeze(1), coupled_tokens(p, noise), tokens)
        # slots after the new root move to the window's front: slot j + shift -> j
        shift = (num_accepted + 1).unsqueeze(1)                                         # [B, 1]
        source = torch.arange(slots, device=p.device).unsqueeze(0) + shift              # [B, S]
        carried = source.clamp(max=slots - 1)
        reuse = spent if spent is not recorded and not self.captured else None
        return tokens.gather(1, carried), _take_slots(recorded, carried, out=reuse), (slots - shift.squeeze(1)).clamp(min=0)

    def _spine_probs(self, target_probs: torch.Tensor, spine: torch.Tensor) -> torch.Tensor:
        """P at the spine's parents [B, S, V], in a kept buffer; it is read only within ``observe``."""
        shape = (target_probs.shape[0], len(spine), target_probs.shape[2])
        buffer = self._spine_buffer.get(shape, target_probs.dtype, target_probs.device)
        return torch.index_select(target_probs, 1, spine, out=buffer)

    # -- a step's two draws: the coupling that carries drafts over, a tree level's extra candidates --

    def couple(self, p: torch.Tensor, old_tokens: torch.Tensor, old_q: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New drafts for every slot and the proposal to record (the module docstring's rule for
        this variant: sjd redraws from P, ac / pac keep a draft by maximal coupling).

        p: [B, S, V] new prediction P_{j-1}; old_tokens: [B, S]; old_q: [B, S, V];
        uniforms: [B, S, 2]  -> tokens [B, S], recorded Q [B, S, V] (= p, always).
        ``old_q`` is spent: its storage is reused for the residual.
        """
        if self.variant == "sjd":
            return sample_with_uniform(p, uniforms[..., 0]), p
        keep = uniforms[..., 0] < acceptance_probability(p, old_q, old_tokens)  # [B, S]; float64 u, never 1.0
        weights, empty = residual_weights(p, old_q, out=old_q)                   # used where the old draft fails
        redrawn = torch.where(empty.squeeze(-1), sample_with_uniform(p, uniforms[..., 1]), sample_with_uniform(weights, uniforms[..., 1]))
        return torch.where(keep, old_tokens, redrawn), p

    def extra_candidates(self, q: torch.Tensor, first: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K - 1 more tokens per row without replacement from q, excluding ``first``.

        q: [B, V]; first: [B]; uniforms: [B, K-1]  -> tokens [B, K-1], exists [B, K-1]
        """
        weights = q.to(torch.float64).clone()
        weights.scatter_(1, first.unsqueeze(1), 0.0)
        picks, exists = [], []
        for k in range(uniforms.shape[1]):
            has_mass = weights.sum(dim=1) > 1e-12
            token = sample_with_uniform(weights, uniforms[:, k])
            picks.append(token)
            exists.append(has_mass)
            weights.scatter_(1, token.unsqueeze(1), 0.0)
        if not picks:
            return torch.zeros(q.shape[0], 0, dtype=torch.long, device=q.device), torch.zeros(q.shape[0], 0, dtype=torch.bool, device=q.device)
        return torch.stack(picks, dim=1), torch.stack(exists, dim=1)

    # -- fresh drafts --------------------------------------------------------------------------

    def _pending(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pending drafts of ``state``'s rows in its batch order (rows new to the batch have
        none): tokens [B, S], Q [B, S, V] (zero past the count), count [B].
        The Q returned is the proposer's own (the pending one is handed over): callers may write it.
        """
        batch, vocab, slots, device, dtype = state.batch_size, state.vocab_size, self.spine_slots, state.device, state.prob_dtype
        if self.pending_tokens is None:
            tokens = torch.zeros(batch, slots, dtype=torch.long, device=device)
            have = torch.zeros(batch, dtype=torch.long, device=device)
            return tokens, torch.zeros(batch, slots, vocab, dtype=dtype, device=device), have
        pending = self.pending_tokens, self.pending_proposals.to(dtype), self.pending_count
        self.pending_proposals = None
        if self.pending_rows != state.row_handles:  # rows left or joined: host-side index, no read-back
            where = {row: i for i, row in enumerate(self.pending_rows)}
            index = torch.tensor([where.get(row, len(self.pending_rows)) for row in state.row_handles], device=device)
            pad = lambda t: torch.cat([t, torch.zeros_like(t[:1])])  # noqa: E731  row len(pending_rows): no drafts
            return tuple(pad(t)[index] for t in pending)
        return pending

    def _allowed(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """allowed [V] bool, its ids [A] and the uniform Q over them [V], once per constraint and device."""
        constraint, device = state.constraint, state.device
        key = (id(constraint), device, state.prob_dtype)
        if self._on_device.get("allowed_key") != key:
            vocab = state.vocab_size
            allowed = constraint.allowed if constraint is not None and constraint.allowed is not None else torch.ones(vocab, dtype=torch.bool)
            allowed = allowed.to(device)
            allowed_ids = allowed.nonzero().flatten()  # once: a read-back
            self._on_device["allowed_key"] = key
            self._on_device["allowed"] = (allowed, allowed_ids, allowed.to(state.prob_dtype) / len(allowed_ids))
        return self._on_device["allowed"]

    def _window_inputs(self, state: DecodeState) -> tuple[torch.Tensor, ...]:
        """What a window needs from the host: the pending drafts (``_pending``: tokens [B, S],
        Q [B, S, V], count [B]), the rows' lengths [B] and, for a spatial prior, their last
        ``offset`` committed tokens, right-aligned (-1: none) [B, offset] ([B, 0] without one)."""
        device = state.device
        pending_tokens, pending_q, have = self._pending(state)
        lengths = torch.tensor([len(g) for g in state.generated], device=device)          # [B]
        offset = {"left": 1, "above": self.grid_width or 0}.get(self.init, 0)
        recent = [[-1] * (offset - len(generated[-offset:])) + generated[-offset:] if offset else [] for generated in state.generated]
        tail = torch.tensor(recent, dtype=torch.long, device=device).view(state.batch_size, offset)  # one host-to-device copy
        return pending_tokens, pending_q, have, lengths, tail

    def _fill_window(self, state: DecodeState, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pending drafts, then fresh ones, for slots 1..S. uniforms: [B, S] -> [B, S], [B, S, V]"""
        allowed, allowed_ids, uniform_q = self._allowed(state)
        forced = state.constraint.forced if state.constraint is not None else None
        return fill_window(*self._window_inputs(state), uniforms, allowed, allowed_ids, uniform_q, forced=forced)


def gumbel_list(q: torch.Tensor, first: torch.Tensor, noise: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A coupled slot's extra candidates: the next ``count`` of its Gumbel top-K list
    (``argsort(q / E)`` = ``argsort(log q + G)``, whose head is ``first``, the slot's own
    Gumbel-max draft), ``first`` excluded. q: [B, V]; first: [B]; noise: [B, V] float64 E
    -> tokens [B, count], exists [B, count] (a candidate without mass under q does not exist)"""
    scores = torch.div(q.to(torch.float64), noise)
    scores.scatter_(1, first.unsqueeze(1), -1.0)
    top = scores.topk(count, dim=-1)
    return top.indices, top.values > 0


def _take_slots(rows: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """rows[b, index[b, s]] for every b, s: whole [V] rows copied (into ``out``, a spent tensor
    of rows' shape apart from it, when given). rows: [B, S, V]; index: [B, S] -> [B, S, V]"""
    batch, slots, vocab = rows.shape
    flat = (torch.arange(batch, device=index.device).unsqueeze(1) * slots + index).flatten()
    if out is None or out.shape != rows.shape or out.dtype != rows.dtype or not out.is_contiguous():
        return rows.reshape(batch * slots, vocab).index_select(0, flat).view(batch, -1, vocab)
    torch.index_select(rows.reshape(batch * slots, vocab), 0, flat, out=out.view(batch * slots, vocab))
    return out
