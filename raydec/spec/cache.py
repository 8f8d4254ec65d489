"""RaggedCache: a batched KV cache in which every row has its own committed length.

One Hugging Face cache (a ``DynamicCache`` whose layers grow in place, ``GrowingLayer``) holds
``[M, H, S, D]`` keys/values for all model rows; all rows share the physical length ``S``. On
top of it we keep, per row,

    valid:         [M, S] bool  slot s holds a committed token of this row
    next_position: [M]    long  position id of the row's next token

Each step the window (a draft tree) is appended for every row; after verification a row keeps
only its root and accepted nodes, the other slots become *holes*. Attention masks hide holes,
so correctness never depends on compaction; compaction only bounds memory and attention cost.
It comes in two sizes: each step the kept nodes of the window just appended are packed to the
window's front and the rest cropped (cost: the window; at batch 1 no hole survives), and once
the holes that rows of different acceptance leave behind are a real share of the cache, every
row's valid slots are gathered to the left (cost: the whole cache).
"""

from __future__ import annotations

from typing import Literal

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys / values are the filled front of a buffer with spare slots.

    ``DynamicLayer`` appends by concatenation, copying the layer's whole cache at every forward;
    here the new slots are written into spare ones (the buffer grows by half when full), so an
    append costs the window, not the cache. ``keys`` / ``values`` are views of the filled front;
    assigning a tensor to them adopts it as the buffer (its spare room: none). The filled length
    follows ``keys``: assign both at once (``layer.keys, layer.values = k, v``) when it changes.
    """

    GROWTH = 1.5

    def __init__(self) -> None:
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._filled = 0
        super().__init__()

    @property
    def keys(self) -> torch.Tensor | None:  # [M, H, filled, D]
        return None if self._key_buffer is None else self._key_buffer[..., : self._filled, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._key_buffer = value
        self._filled = value.shape[-2] if value is not None and value.dim() >= 2 else 0

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._value_buffer is None else self._value_buffer[..., : self._filled, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._value_buffer = value

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._filled, self._filled + key_states.shape[-2]
        buffer = self._key_buffer
        if buffer is None or buffer.dim() != key_states.dim() or buffer.shape[-2] < end:
            capacity = int(self.GROWTH * end) + 16
            keys = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
            values = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
            if start:
                keys[..., :start, :] = self._key_buffer[..., :start, :]
                values[..., :start, :] = self._value_buffer[..., :start, :]
            self._key_buffer, self._value_buffer = keys, values
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self._filled = end
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop: expected the negative number of slots to remove, got {tokens_to_remove}")
        self._filled = max(0, self._filled + tokens_to_remove)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._key_buffer is not None and self._key_buffer.dim() == 4:
            filled = self._filled
            self._key_buffer, self._value_buffer = self._key_buffer[indices], self._value_buffer[indices]
            self._filled = filled

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._key_buffer is not None and self._key_buffer.dim() == 4:
            filled = self._filled
            self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
            self._filled = filled


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` of :class:`GrowingLayer` s (created as the model's layers first write)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)


class RaggedCache:
    """Valid-slot bookkeeping over an HF ``DynamicCache`` (see module docstring)."""

    def __init__(self, num_rows: int, compaction: Literal["auto", "always", "never"] = "auto") -> None:
        self.kv = GrowingCache()
        self.valid = torch.zeros(num_rows, 0, dtype=torch.bool)  # [M, S]
        self.next_position = torch.zeros(num_rows, dtype=torch.long)  # [M]
        self.compaction = compaction

    # -- shape ---------------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        return self.valid.shape[0]

    @property
    def length(self) -> int:
        """Physical slots S (valid or not)."""
        return self.valid.shape[1]

    def committed_lengths(self) -> torch.Tensor:
        """[M] number of valid slots per row."""
        return self.valid.sum(dim=1)

    # -- masks and positions for a new window --------------------------------------------------

    def attention_mask(self, window_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Additive 4-D mask for a window forward.

        window_mask: [M, N, N] bool (query i may see window node j)
        returns:     [M, 1, N, S + N] with 0 where attention is allowed and dtype-min elsewhere
        """
        rows, width, _ = window_mask.shape
        prefix = self.valid.unsqueeze(1).expand(rows, width, self.length)  # [M, N, S]
        allowed = torch.cat([prefix, window_mask], dim=2)
        mask = torch.zeros(allowed.shape, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask.unsqueeze(1)

    def window_positions(self, depth: torch.Tensor) -> torch.Tensor:
        """Position ids of the window nodes: next position + depth. depth: [M, N] -> [M, N]"""
        return self.next_position.unsqueeze(1) + depth

    # -- updates -------------------------------------------------------------------------------

    def start(self, valid: torch.Tensor, next_position: torch.Tensor) -> None:
        """After the prefill forward: which prompt slots are real ([M, S]) and next positions ([M])."""
        self.valid = valid.clone()
        self.next_position = next_position.clone().long()
        self._check_physical_length()

    def commit(self, keep: torch.Tensor) -> None:
        """The last N slots were just appended by a window forward; keep the marked ones.

        keep: [M, N] bool (root and accepted nodes). Kept nodes lie on one root-to-node path,
        so the row's next position advances by their count.
        """
        if self.compaction != "never":
            keep = self._pack_window(keep)
        self.valid = torch.cat([self.valid, keep], dim=1)
        self.next_position = self.next_position + keep.sum(dim=1)
        self._check_physical_length()
        self._trim_tail()
        if self._should_compact():
            self.compact()

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given model rows (finished rows leave the batch). rows: [M'] long."""
        self.kv.batch_select_indices(rows)
        self.valid = self.valid[rows]
        self.next_position = self.next_position[rows]

    def append_rows(self, other: "RaggedCache", blocks: int = 1) -> None:
        """Add ``other``'s rows to this cache's (rows joining a running batch).

        Both caches hold their rows in ``blocks`` equal blocks (CFG: conditional rows, then
        unconditional ones); block k of ``other`` goes after block k of this cache. The shorter
        cache gets hole slots at its end, so both share one physical length.
        """
        width = max(self.length, other.length)

        def join(a: torch.Tensor, b: torch.Tensor, slot_dim: int) -> torch.Tensor:
            pad = [0, 0] * (a.dim() - 1 - slot_dim)
            a, b = (torch.nn.functional.pad(t, pad + [0, width - t.shape[slot_dim]]) for t in (a, b))
            b = b.to(a.device, a.dtype)
            return torch.cat([part for pair in zip(a.chunk(blocks), b.chunk(blocks)) for part in pair], dim=0)

        for mine, theirs in zip(self.kv.layers, other.kv.layers):
            mine.keys, mine.values = join(mine.keys, theirs.keys, 2), join(mine.values, theirs.values, 2)
        self.valid = join(self.valid, other.valid, 1)
        self.next_position = torch.cat([part for pair in zip(self.next_position.chunk(blocks), other.next_position.chunk(blocks)) for part in pair])
        self._check_physical_length()

    def compact(self) -> None:
        """Gather every row's valid slots to the left (stable order) and crop the tail."""
        counts = self.committed_lengths()
        width = int(counts.max()) if self.num_rows else 0
        if width == self.length and bool(self.valid.all()):
            return
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :width]  # [M, width]
        self._gather_slots(order, start=0)
        if width < self.length and len(self.kv.layers):
            self.kv.crop(width - self.length)
        self.valid = self.valid.gather(1, order)

    # -- internals -----------------------------------------------------------------------------

    def _pack_window(self, keep: torch.Tensor) -> torch.Tensor:
        """Move each row's kept nodes of the just-appended window to its front (in node order)
        and crop the window to the most any row kept. keep: [M, N] -> [M, N'] (N' <= N)."""
        width = keep.shape[1]
        counts = keep.sum(dim=1, keepdim=True)                       # [M, 1]
        kept = int(counts.max()) if self.num_rows else 0
        packed = torch.arange(width).unsqueeze(0) < counts           # [M, N]: kept nodes first
        if not torch.equal(keep, packed):
            order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :kept]  # [M, N']
            self._gather_slots(order, start=self.length)  # valid does not cover the window yet
        if kept < width and len(self.kv.layers):
            self.kv.crop(kept - width)
        return packed[:, :kept]

    def _gather_slots(self, order: torch.Tensor, start: int) -> None:
        """In place, for every row: slots start.. := its slots start + order[row] (order: [M, W]).
        Writes only the first W slots from ``start``; the caller crops what lies beyond."""
        for layer in self.kv.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            for cached in (layer.keys, layer.values):  # [M, H, S, D] views of the layer's buffers
                index = order[:, None, :, None].expand(-1, cached.shape[1], -1, cached.shape[3]).to(cached.device)
                cached[:, :, start : start + order.shape[1]] = cached[:, :, start:].gather(2, index)

    def _physical_length(self) -> int:
        return self.kv.get_seq_length() if len(self.kv.layers) else self.length

    def _check_physical_length(self) -> None:
        physical = self._physical_length()
        if len(self.kv.layers) and physical != self.length:
            raise RuntimeError(f"KV cache has {physical} slots but the valid mask tracks {self.length}")

    def _trim_tail(self) -> None:
        """Crop trailing slots that no row uses (cheap: no copy)."""
        used = self.valid.any(dim=0)
        if bool(used.all()):
            return
        last_used = int(used.nonzero().max()) + 1 if bool(used.any()) else 0
        drop = self.length - last_used
        if drop > 0:
            if len(self.kv.layers):
                self.kv.crop(-drop)
            self.valid = self.valid[:, :last_used]

    def _should_compact(self) -> bool:
        if self.compaction == "never" or self.length == 0:
            return False
        if self.compaction == "always":
            return True
        removable = self.length - int(self.committed_lengths().max())
        # auto: copy the cache only once the columns it frees are a real share of attention
        return removable > max(32, self.length // 4)
