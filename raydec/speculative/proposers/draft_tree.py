"""EAGLE-2 dynamic draft trees from a draft network (ViSpec, or text-only EAGLE).

Per step and row:

    catch up:  feed the pairs (f, x) the target just accepted -> draft hidden h at the root
    level 1:   top-K children of the root by draft log-probability
    level l:   expand the K best nodes of level l-1 (one draft forward over K nodes per row,
               tree mask = ancestors), each with its top-K children; score = cumulative logp
    select:    the ``total_tokens - 1`` best candidates; ties go to the shallower node, so a
               parent always ranks before its children and survives

A draft top-K is a deterministic function of the context, so every node's proposal is one-hot:
the shared verifier does recursive rejection over siblings (greedy: longest argmax prefix).
The draft model keeps its own ragged KV cache; tree slots are cropped after each step.

Captured (``Proposer.capture``), the step is one compiled function (``_step_on_tensors``) at
fixed shapes: the draft model attends over its cache's whole buffers (their capacity) under a mask that
blocks every slot but the row's committed ones, the catch-up always feeds ``depth + 1`` pairs
(the padding ones masked), and the tree's keys and values stay tensors of the function instead
of slots of the cache. Only the caught-up pairs' keys and values leave it, to be written into the
cache in place, as the eager catch-up writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from raydec.config import DraftTreeConfig
from raydec.speculative.cache import RaggedCache
from raydec.speculative.capture import StepGraph
from raydec.speculative.proposers.base import DecodeState, Prefill, Proposer
from raydec.speculative.proposers.tree_search import (
    SearchConstants, additive_mask, candidate_depths, catch_up_on_tensors, search_tree, select_nodes,
    select_tree_nodes as select_tree_nodes,  # re-exported from this module, its earlier home
)
from raydec.speculative.tree import DraftTree, ancestors_within, identity_mask

@dataclass(frozen=True)
class _TreeLayout:
    """A tree shape's index tensors for one batch size (B rows, top-K, C candidates), on the draft model's device."""

    key: tuple[int, int, int]  # (B, K, depth)
    cand_depth: torch.Tensor  # [B, C] depth of every candidate
    search: SearchConstants  # its root_children[:, :1] is the root's parent (-1)


def _select_on_tensors(
    roots: torch.Tensor, layout: _TreeLayout, scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
    """The ``count`` best candidates of every row as a tree: tokens, parents, depth [B, count + 1]
    (node 0 is the root, then by depth, then rank) and None (the tree derives its ancestor mask).
    A parent outranks its children (its score is higher, or equal and shallower), so every
    chosen node's parent is chosen."""
    return select_nodes(roots, layout.cand_depth, layout.search.root_children[:, :1], scores, tokens, parents, count)


class DraftTreeProposer(Proposer):
    """Draft-model proposer (see module docstring). ``draft_model``: a ``VispecDraft`` (vision or not)."""

    wants_hidden = True

    def __init__(self, draft_model: Any, tree: DraftTreeConfig | None = None) -> None:
        self.draft_model = draft_model
        self.spec = tree or DraftTreeConfig()
        self.cache: RaggedCache | None = None
        self.row_handles: list[int] = []
        self.root_hidden: torch.Tensor | None = None  # [B, H] draft hidden at each root
        # the pairs (f, x) each row accepted last step, for the draft model to read: target features
        # [B, N, H], tokens [B, N], and how many of the N are real (host ints; 0: nothing to feed)
        self.pending_features: torch.Tensor | None = None
        self.pending_tokens: torch.Tensor | None = None
        self.pending_counts: list[int] = []
        self.rows: Any = None  # the draft model's DecodeRows: g of each row's last image, whether it has one, folded biases
        #: set to a list to record each expansion as (frontier candidate ids [B, K], their
        #: draft hidden [B, K, H], candidate tokens [B, C], candidate parents [B, C]), to inspect the search
        self.trace: list | None = None
        self._tree_layout: _TreeLayout | None = None
        self._constants: tuple | None = None  # (key, the tree's constant fields): ``_tree_constants``
        self._on_device: dict = {}  # the rows' image flags and the vocabulary mask on the draft model's device
        self.capture(False, torch.device("cpu"))  # the step eager until an engine says otherwise

    @property
    def _device(self) -> torch.device:
        return next(self.draft_model.parameters()).device

    @property
    def _dtype(self) -> torch.dtype:
        return next(self.draft_model.parameters()).dtype

    # -- start: draft prefill ------------------------------------------------------------------

    admits_rows = True

    @torch.inference_mode()
    def start(self, state: DecodeState, first_probs: torch.Tensor, prefill: Prefill) -> None:
        self.cache, self.root_hidden, globals_, has_global = self._prefill_rows(state, prefill)
        self.rows = self.draft_model.decode_rows(globals_, has_global)
        self.row_handles = list(state.row_handles)
        self.pending_features = self.pending_tokens = None
        self.pending_counts = [0] * state.batch_size

    @torch.inference_mode()
    def admit(self, state: DecodeState, first_probs: torch.Tensor, prefill: Prefill) -> None:
        """Rows joining the batch: their draft prefill, then their state after the others'."""
        cache, root_hidden, globals_, has_global = self._prefill_rows(state, prefill)
        self.cache.append_rows(cache)
        self.root_hidden = torch.cat([self.root_hidden, root_hidden])
        self.rows = self.rows.concat(self.draft_model.decode_rows(globals_, has_global))
        self.row_handles += list(state.row_handles)
        if self.pending_features is not None:
            new = state.batch_size
            self.pending_features = torch.cat([self.pending_features, self.pending_features.new_zeros(new, *self.pending_features.shape[1:])])
            self.pending_tokens = torch.cat([self.pending_tokens, self.pending_tokens.new_zeros(new, self.pending_tokens.shape[1])])
        self.pending_counts += [0] * state.batch_size

    def _prefill_rows(self, state: DecodeState, prefill: Prefill) -> tuple[RaggedCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The draft model reads the rows' prompts: -> their draft cache, draft hidden at each root
        [B, H], g of each row's last image [B, H] and whether the row has one [B]."""
        batch = state.batch_size
        if prefill.inputs_embeds.shape[0] != batch:
            raise ValueError("draft-model decoding does not support classifier-free guidance")
        if prefill.output.hidden is None:
            raise RuntimeError("the target returned no hidden states; draft proposers need them")
        device, dtype = self._device, self._dtype
        hidden = prefill.output.hidden.to(device, dtype)  # [B, L, H]
        embeds = prefill.inputs_embeds.to(device, dtype)
        first = self.draft_model.embed_tokens(state.roots().to(device)).to(dtype)  # [B, H]
        sequences = []
        for r in range(batch):
            idx = prefill.valid[r].nonzero().flatten().to(device)
            n = idx.numel()
            token_embeds = torch.cat([embeds[r, idx[1:]], first[r : r + 1]])
            token_image = torch.cat([prefill.image_index[r, idx[1:].cpu()], torch.tensor([-1])])
            sequences.append(self.draft_model.build_sequence(token_embeds, hidden[r, idx], token_image.to(device), torch.arange(n, device=device)))
        width = max(s.length for s in sequences)
        size = hidden.shape[-1]
        tok = torch.zeros(batch, width, size, device=device, dtype=dtype)
        feat = torch.zeros_like(tok)
        glob = torch.zeros_like(tok)
        use = torch.zeros(batch, width, dtype=torch.bool, device=device)
        pos = torch.zeros(batch, width, dtype=torch.long, device=device)
        valid = torch.zeros(batch, width, dtype=torch.bool)
        last_global = torch.zeros(batch, size, device=device, dtype=dtype)
        has_global = torch.zeros(batch, dtype=torch.bool)  # host-known, as DecodeRows keeps it
        for r, s in enumerate(sequences):
            lo = width - s.length
            tok[r, lo:], feat[r, lo:], pos[r, lo:] = s.token_embeds, s.features, s.positions
            valid[r, lo:] = True
            if s.globals_.shape[0]:
                g = s.globals_[s.global_index.clamp(min=0)]
                glob[r, lo:], use[r, lo:] = g, s.global_index >= 0
                last_global[r], has_global[r] = s.globals_[-1], True
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
        allowed = (causal.unsqueeze(0) & valid.unsqueeze(1)) | identity_mask(width).unsqueeze(0)
        cache = RaggedCache(batch, compaction="auto", device=device, zero_tail=self.captured)  # captured: read past its length
        if self.captured:  # a buffer that does not grow while the rows decode: one capacity, one captured shape
            cache.reserve(prefill.room)
        mask = additive_mask(allowed, dtype).to(device)
        h = self.draft_model(tok, feat, pos, mask, cache.kv, glob, use)
        lengths = torch.tensor([int(prefill.valid[r].sum()) for r in range(batch)])
        cache.start(valid, lengths)
        return cache, h[:, -1].contiguous(), last_global, has_global  # [B, H] as every step leaves it

    # -- propose -------------------------------------------------------------------------------

    def _sync_rows(self, state: DecodeState) -> None:
        """Follow the engine when finished rows leave the batch."""
        if state.row_handles == self.row_handles:
            return
        where = {row: i for i, row in enumerate(self.row_handles)}
        index = [where[r] for r in state.row_handles]
        self.cache.select_rows(index)
        self.rows = self.rows.select(index)
        on_device = torch.tensor(index, dtype=torch.long, device=self._device)
        if self.root_hidden is not None:
            self.root_hidden = self.root_hidden[on_device]
        if self.pending_features is not None:
            self.pending_features, self.pending_tokens = self.pending_features[on_device], self.pending_tokens[on_device]
        self.pending_counts = [self.pending_counts[where[r]] for r in state.row_handles]
        self.row_handles = list(state.row_handles)

    def _catch_up(self) -> None:
        """Feed each row's newly accepted pairs; the draft hidden at the last one is the root's.
        Rows that just joined have nothing pending: their root hidden is their prefill's."""
        counts = self.pending_counts
        width = max(counts, default=0)
        if not width:
            return
        device, dtype = self._device, self._dtype
        batch = len(counts)
        feat = self.pending_features[:, :width].to(device, dtype)  # [B, n, H]
        ids = self.pending_tokens[:, :width].to(device)
        count = torch.tensor(counts, device=device)  # host ints -> the device, no read-back
        valid = torch.arange(width, device=device).unsqueeze(0) < count.unsqueeze(1)  # [B, n]
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril().unsqueeze(0) & valid.unsqueeze(1)
        window = causal | identity_mask(width).to(device).unsqueeze(0)
        tok = self.draft_model.embed_tokens(ids.clamp(min=0)).to(dtype)
        mask = self.cache.attention_mask(window, dtype)
        positions = self.cache.window_positions(torch.arange(width, device=device).expand(batch, width))
        h = self.draft_model.decode_forward(tok, feat, positions, mask, self.cache.kv, self.rows, self.cache.max_next_position + width - 1)
        self.cache.commit(valid, counts, width - 1)
        fed = h[torch.arange(batch, device=device), (count - 1).clamp(min=0)]
        self.root_hidden = torch.where((count > 0).unsqueeze(1), fed, self.root_hidden)
        self.pending_counts = [0] * batch

    def _log_probs(self, hidden: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Draft log-probabilities, allowed tokens only. hidden [..., H] -> [..., V] float32"""
        logits = self.draft_model.logits(hidden).float()
        if state.constraint is not None and state.constraint.restricts:
            logits = logits.masked_fill(~state.constraint.allowed.to(logits.device), float("-inf"))
        return torch.log_softmax(logits, dim=-1)

    def _layout(self, batch: int, k: int) -> "_TreeLayout":
        """Index tensors that depend only on the batch size and the tree shape (kept across steps)."""
        key = (batch, k, self.spec.depth)
        if self._tree_layout is None or self._tree_layout.key != key:
            device = self._device
            self._tree_layout = _TreeLayout(key=key, cand_depth=candidate_depths(k, self.spec.depth, device).expand(batch, -1),
                                            search=SearchConstants.make(batch, k, device, self._dtype))
        return self._tree_layout

    def capture(self, enabled: bool, device: torch.device) -> None:
        self.captured = enabled
        # the draft cache's buffers (keys, values: dim 2) and their valid slots (dim 1) grow
        self._step_graph = StepGraph(self._step_on_tensors, "draft_tree", enabled, device, lengths=((4, 2), (5, 2), (6, 1)))

    def step_graphs(self) -> tuple[StepGraph, ...]:
        return (self._step_graph,)

    def _runs_captured(self) -> bool:
        """The captured step needs the draft model's inference form (with its rows' folded biases) and
        its one cache layer written in place; a trace runs eagerly."""
        return (
            self.captured and self.trace is None and self.draft_model.captures and self.rows.bias is not None
            and self.cache.layout == "slots" and len(self.cache.kv.layers) == 1
        )

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> DraftTree:
        self._sync_rows(state)
        if self._runs_captured():
            return self._propose_captured(state)
        self._catch_up()
        spec, dtype = self.spec, self._dtype
        k = min(spec.top_k, state.vocab_size)
        layout = self._layout(len(self.row_handles), k)
        committed = self.cache.length  # tree slots live after this and are cropped at the end
        next_position = self.cache.next_position.unsqueeze(1).expand(-1, k).to(self._device)  # [B, K]: the root's children
        max_position = self.cache.max_next_position  # the host's bound: no read-back

        def forward(tokens: torch.Tensor, features: torch.Tensor, step: int, mask: torch.Tensor) -> torch.Tensor:
            embeds = self.draft_model.embed_tokens(tokens).to(dtype)  # the frontier's keys and values join the cache
            return self.draft_model.decode_forward(embeds, features, next_position + step, mask, self.cache.kv, self.rows, max_position + step)

        scores, tokens, parents = search_tree(forward, lambda h: self._log_probs(h, state), self.root_hidden,
                                              self.cache.valid.to(self._device), k, spec.depth, dtype, layout.search, self.trace,
                                              self._noise(state))
        grown = self.cache.kv.get_seq_length() - committed
        if grown:
            self.cache.kv.crop(-grown)
        return self._select(state, layout, scores, tokens, parents)

    def _select(
        self, state: DecodeState, layout: "_TreeLayout", scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor
    ) -> DraftTree:
        """The ``total_tokens - 1`` best candidates as a tree in topological order.
        scores, tokens, parents (candidate ids, -1 = root): [B, C]"""
        count = self._node_count(layout.key[1])
        node_tokens, node_parents, depth, _ = _select_on_tensors(state.roots().to(scores.device), layout, scores, tokens, parents, count)
        return self._tree(state, node_tokens, node_parents, depth)

    def _noise(self, state: DecodeState) -> torch.Tensor | None:
        """[B, depth, V] float32: each tree level's Gumbel noise at its generated position, zero
        for the rows that are not coupled (None: no row is). Level 1 drafts position ``positions``."""
        if state.coupling == "rejection":
            return None
        exponentials = state.random.exponentials(torch.arange(self.spec.depth), state.vocab_size)
        noise = torch.neg(torch.log(exponentials)).to(device=self._device, dtype=torch.float32)  # G = -log E
        return noise if state.coupling == "gumbel" else noise * state.random.flags().to(noise.device).view(-1, 1, 1)

    # -- the captured step ------------------------------------------------------------------------

    def _propose_captured(self, state: DecodeState) -> DraftTree:
        """``propose`` as one captured function (``_step_on_tensors``): the draft model reads the cache's
        buffers whole, under a mask that blocks every slot but the rows' committed ones; the pairs
        it catches up on join the cache after it, as ``_catch_up``'s do."""
        spec, device, dtype = self.spec, self._device, self._dtype
        batch = len(self.row_handles)
        k = min(spec.top_k, state.vocab_size)
        nodes = self._node_count(k) + 1  # a tree's, root included
        width = min(spec.depth + 1, nodes)  # pairs a step can accept: the deepest path and the bonus token
        counts = self.pending_counts
        feats, ids = self._pending_pairs(batch, nodes)
        cache = self.cache
        layer = cache.kv.layers[0]
        past_valid = torch.nn.functional.pad(cache.valid, (0, layer.capacity - cache.length))  # [B, C]: committed slots
        # every position the step reads (the padding pairs' included) is in the rotary table already
        self.draft_model.reserve_positions(max(cache.max_next_position + width + spec.depth, self.draft_model.config.max_position_embeddings), dtype)
        has_global, allowed = self._device_inputs(state)
        noise = self._noise(state)
        coupled = noise is not None
        batch_inputs = (feats, ids, torch.tensor(counts, device=device), self.root_hidden, layer.buffer_keys, layer.buffer_values,
                        past_valid, cache.next_position, state.roots().to(device), self.rows.bias, has_global,
                        noise if coupled else torch.zeros(batch, 0, 0, device=device))
        with self.draft_model.attention_scope(device):
            node_tokens, node_parents, depth, ancestors, self.root_hidden, window, fed = self._step_graph(
                batch, batch_inputs, (allowed, self.draft_model.routed_head(dtype)), width=width, top_k=k, depth=spec.depth, count=nodes - 1,
                head_dtype=self.draft_model.head_dtype, dtype=dtype, coupled=coupled,
            )
        last = max(counts, default=0)
        if last:  # the real pairs join the cache; the padding ones after the last real one are cropped
            layer.update(window[:, 0], window[:, 1])
            cache.commit(fed, counts, last - 1)
        self.pending_counts = [0] * batch
        return self._tree(state, node_tokens, node_parents, depth, ancestors)

    def _pending_pairs(self, batch: int, nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The pending pairs of the last tree (``nodes`` wide): features [B, n, H], tokens [B, n]
        (zeros before any step: no pair is real then). Whole, so a padded batch keeps their layout."""
        device, dtype = self._device, self._dtype
        if self.pending_features is None:
            return (torch.zeros(batch, nodes, self.root_hidden.shape[-1], device=device, dtype=dtype),
                    torch.zeros(batch, nodes, dtype=torch.long, device=device))
        return self.pending_features.to(device, dtype), self.pending_tokens.to(device)

    def _device_inputs(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rows' image flags [B] and the allowed tokens [V] (None: all) on the draft model's device,
        copied once per batch of rows and constraint."""
        device = self._device
        rows, constraint = self.rows, state.constraint
        restricts = constraint is not None and constraint.restricts
        if "rows" not in self._on_device or self._on_device["rows"] is not rows:
            self._on_device.update(rows=rows, has_global=rows.has_global.to(device))
        if "constraint" not in self._on_device or self._on_device["constraint"] is not constraint:
            self._on_device.update(constraint=constraint, allowed=constraint.allowed.to(device) if restricts else None)
        return self._on_device["has_global"], self._on_device["allowed"]

    def _step_on_tensors(
        self, feats: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor, root_hidden: torch.Tensor, past_keys: torch.Tensor,
        past_values: torch.Tensor, past_valid: torch.Tensor, next_position: torch.Tensor, roots: torch.Tensor, bias: torch.Tensor,
        has_global: torch.Tensor, noise: torch.Tensor, allowed: torch.Tensor | None, head: tuple | None,
        *, width: int, top_k: int, depth: int, count: int, head_dtype: torch.dtype, dtype: torch.dtype, coupled: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """One ``propose`` on tensors alone (the captured function): catch up, search, select.

        feats [B, n, H], ids [B, n]: the pending pairs, counts [B] of them real, at most ``width``;
        root_hidden [B, H]; past_keys, past_values [B, kv, C, d]: the draft cache's buffers,
        past_valid [B, C] their committed slots; next_position, roots [B]; bias [B, H], has_global [B]: the rows'
        ``DecodeRows``; noise [B, depth, V]: ``_noise`` when ``coupled``; allowed [V] bool or None;
        head: the draft model's ``routed_head``
        -> tokens, parents, depth of the tree [B, n]; its ancestor mask [B, n, n]; the new root
           hidden [B, H]; the pairs' keys and values [B, 2, kv, W, d]; real pairs [B, W] bool
        """
        draft_model = self.draft_model

        def forward(tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor,
                    values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            embeds = draft_model.embed_tokens(tokens).to(dtype)
            return draft_model.window_forward(embeds, features, positions, mask, keys, values, bias, has_global)

        def log_probs(hidden: torch.Tensor) -> torch.Tensor:  # ``_log_probs``
            logits = draft_model.head_logits(hidden, head, head_dtype).float()
            if allowed is not None:
                logits = logits.masked_fill(~allowed, float("-inf"))
            return torch.log_softmax(logits, dim=-1)

        root_hidden, keys, values, fed = catch_up_on_tensors(
            forward, feats[:, :width], ids[:, :width], counts, root_hidden, past_keys, past_values, past_valid, next_position, dtype)
        # the slots every node sees, then room for the frontier's keys and values of each level but the last
        past = past_keys.shape[2] + width
        room = past_keys.new_zeros(*past_keys.shape[:2], top_k * (depth - 2), past_keys.shape[3]) if depth > 2 else past_keys[:, :, :0]
        tree_keys, tree_values = torch.cat([past_keys, keys, room], dim=2), torch.cat([past_values, values, room], dim=2)
        positions = (next_position + counts).unsqueeze(1).expand(-1, top_k)  # [B, K]: the root's children

        def level_forward(tokens: torch.Tensor, features: torch.Tensor, step: int, mask: torch.Tensor) -> torch.Tensor:
            end = past + top_k * step  # the slots seen so far
            h, new_keys, new_values = forward(tokens, features, positions + step, mask, tree_keys[:, :, :end], tree_values[:, :, :end])
            if step < depth - 2:  # the next level attends to this one's slots
                tree_keys[:, :, end : end + top_k] = new_keys
                tree_values[:, :, end : end + top_k] = new_values
            return h

        scores, tokens, parents = search_tree(level_forward, log_probs, root_hidden, torch.cat([past_valid, fed], dim=1), top_k, depth, dtype,
                                              noise=noise if coupled else None)
        batch, device = roots.shape[0], roots.device
        root_parent = torch.full((batch, 1), -1, dtype=torch.long, device=device)
        node_tokens, node_parents, node_depth, _ = select_nodes(
            roots, candidate_depths(top_k, depth, device).expand(batch, -1), root_parent, scores, tokens, parents, count)
        ancestors = ancestors_within(node_parents, torch.ones_like(node_parents, dtype=torch.bool), depth)  # every node is real
        return node_tokens, node_parents, node_depth, ancestors, root_hidden, torch.stack([keys, values], dim=1), fed

    def _node_count(self, k: int) -> int:
        """Draft nodes a tree holds: ``total_tokens - 1``, at most every candidate of the search."""
        return min(self.spec.total_tokens - 1, k + (self.spec.depth - 1) * k * k)

    def _tree(
        self, state: DecodeState, tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor | None = None
    ) -> DraftTree:
        """The selected nodes as a ``DraftTree``: tokens, parents, depth [B, n]; ancestors [B, n, n]
        when known (None: the tree derives its mask)."""
        batch, n = tokens.shape
        k = min(self.spec.top_k, state.vocab_size)
        valid, proposal_index, without_replacement, proposal_probs = self._tree_constants(state, batch, n, tokens.device)
        tree = DraftTree(
            tokens=tokens,
            parents=parents,
            valid=valid,
            proposal_index=proposal_index,
            without_replacement=without_replacement,
            proposal_probs=proposal_probs,
            max_children=k,  # a node's children are some of its top-K
            levels=self.spec.depth,
            any_without_replacement=False,
            # only the root and expanded frontier nodes have children; two or more each
            branch_nodes=min((n - 1) // 2, 1 + (self.spec.depth - 1) * k),
        )
        return tree.with_structure(depth, ancestors)  # known here; no read-back

    def _tree_constants(self, state: DecodeState, batch: int, n: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """A tree's fields that are the same every step (read only, kept across steps): every node
        real [B, n], one-hot [B, n], none without replacement [B, n], no dense proposals [B, 0, V]."""
        key = (batch, n, state.vocab_size, state.prob_dtype, device)
        if self._constants is None or self._constants[0] != key:
            self._constants = (key, (
                torch.ones(batch, n, dtype=torch.bool, device=device),
                torch.full((batch, n), -1, dtype=torch.long, device=device),
                torch.zeros(batch, n, dtype=torch.bool, device=device),
                torch.zeros(batch, 0, state.vocab_size, dtype=state.prob_dtype, device=device),
            ))
        return self._constants[1]

    # -- observe -------------------------------------------------------------------------------

    def observe(self, state: DecodeState, tree: DraftTree, target_probs: torch.Tensor, result: Any, output: Any) -> None:
        """The pairs to feed next step: the target's hidden state at the root and each accepted
        node, each with the token committed after it."""
        hidden = output.hidden  # [B, N, H] target last hidden states at the tree nodes
        path = result.path.clamp(min=0).to(hidden.device)  # [B, N] root, accepted nodes, then padding
        self.pending_features = hidden.gather(1, path.unsqueeze(2).expand(-1, -1, hidden.shape[-1]))
        self.pending_tokens = result.committed(tree)
        self.pending_counts = [n + 1 for n in result.accepted_counts]
