"""A KV cache written in place: each layer's keys and values live in a preallocated buffer.

Hugging Face's ``DynamicLayer`` appends by concatenation, so every forward copies the layer's
whole cache: the bytes a decode step moves grow with the context. ``SlotLayer`` keeps

    buffer_keys, buffer_values: [R, H, capacity, D]   (R >= M rows, capacity >= length, grown by doubling)
    keys, values:               [M, H, length, D]     views of the buffers' first rows and slots

A forward's new slots are written where they go (bytes of the window only); cropping moves the
length back; compaction gathers a row's kept slots to the left inside the buffer. A step copies
the whole cache only when the buffer grows, which doubling makes rare: amortised, the bytes a
step moves do not grow with the context. A layer with room for rows (``reserve_rows``, the
decode batch's cache) also takes rows in place: a row leaving has its place taken by a row from
the end (its slots up to the length move), rows joining are written behind the others, and
neither copies the rest of the batch. ``copied_bytes`` counts every byte a layer writes or
copies, for the benches.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

#: slots a new buffer holds beyond its first write (a prompt and a few steps, before any growth)
INITIAL_HEADROOM = 64


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class SlotLayer(DynamicLayer):
    """One layer's keys and values in a buffer with room to grow (see module docstring)."""

    def __init__(self, capacity: int = 0, zero_tail: bool = False, row_room: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.buffer_keys: torch.Tensor | None = None
        self.buffer_values: torch.Tensor | None = None
        self.length = 0
        self.rows = 0  # M: the rows in use, the buffers' first ones
        self.copied_bytes = 0
        self.minimum_capacity = capacity  # what the first write allocates at least
        # rows a buffer holds at least (0: exactly the rows in use; then rows leave by a copy into
        # a new buffer, which a reader of the whole buffer, the captured draft step, relies on)
        self.row_room = row_room
        # new buffers hold zeros past the length, for a reader that attends over the whole buffer
        # under a mask (the captured draft step: a masked slot must be finite, not NaN); else they
        # are left unwritten there (no memset of the capacity on every growth and refill)
        self.zero_tail = zero_tail

    def reset(self) -> None:
        self.buffer_keys = self.buffer_values = None
        self.length = self.rows = 0
        super().reset()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    @property
    def capacity(self) -> int:
        return 0 if self.buffer_keys is None else self.buffer_keys.shape[2]

    def reserve(self, slots: int) -> None:
        """Room for at least ``slots`` slots from now on (one copy of the kept slots, if it grows)."""
        if self.buffer_keys is not None and slots > self.capacity:
            self._grow(slots)

    def reserve_rows(self, rows: int) -> None:
        """Room for at least ``rows`` rows from now on: rows then join and leave in place."""
        self.row_room = max(self.row_room, rows)
        if self.buffer_keys is not None and rows > self.buffer_keys.shape[0]:
            self._grow(self.capacity)

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        """Buffers for at least ``needed`` slots, the kept slots moved over when they grow."""
        rows = key_states.shape[0]
        if self.buffer_keys is None:
            self.rows = rows
            self.buffer_keys = self._new_buffer(key_states, self._row_capacity(), self._slot_capacity(needed))
            self.buffer_values = self._new_buffer(value_states, self._row_capacity(), self.buffer_keys.shape[2])
            return
        if rows != self.rows:
            raise ValueError(f"a write of {rows} rows into a cache of {self.rows} rows")
        if needed > self.capacity:
            self._grow(self._slot_capacity(needed))

    def _slot_capacity(self, needed: int) -> int:
        return max(needed + INITIAL_HEADROOM, 2 * self.capacity, self.minimum_capacity)

    def _row_capacity(self) -> int:
        return max(self.rows, self.row_room)

    def _grow(self, capacity: int) -> None:
        """New buffers of ``capacity`` slots and room for the rows; the rows' slots moved over."""
        keys = self._new_buffer(self.buffer_keys, self._row_capacity(), capacity)
        values = self._new_buffer(self.buffer_values, self._row_capacity(), capacity)
        if self.length:
            keys[: self.rows, :, : self.length] = self.keys
            values[: self.rows, :, : self.length] = self.values
            self.copied_bytes += 2 * _bytes(self.keys)
        self.buffer_keys, self.buffer_values = keys, values
        self._expose()

    def _new_buffer(self, like: torch.Tensor, rows: int, capacity: int) -> torch.Tensor:
        shape = (rows, like.shape[1], capacity, like.shape[3])
        return like.new_zeros(shape) if self.zero_tail else like.new_empty(shape)

    def _expose(self) -> None:
        self.keys = self.buffer_keys[: self.rows, :, : self.length]
        self.values = self.buffer_values[: self.rows, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states: [M, H, N, D], written after the layer's ``length`` slots."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[2]
        self._reserve(key_states, value_states, self.length + new)
        self.buffer_keys[: self.rows, :, self.length : self.length + new] = key_states
        self.buffer_values[: self.rows, :, self.length : self.length + new] = value_states
        self.copied_bytes += _bytes(key_states) + _bytes(value_states)
        self.length += new
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of slots to drop, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.length:
            return
        self.length = max(0, self.length + tokens_to_remove)
        self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (rows leaving the batch): one copy of the kept rows into new
        buffers (exactly as many rows; their tails kept)."""
        if self.buffer_keys is None:
            return
        self.buffer_keys = self.buffer_keys[indices]
        self.buffer_values = self.buffer_values[indices]
        self.rows = self.buffer_keys.shape[0]
        self.copied_bytes += self.held_bytes()
        self._expose()

    def keep_rows(self, rows: list[int]) -> None:
        """Keep the rows ``rows`` (distinct indices into the rows in use, on the host), in that order.
        With room for rows, in place: only a row whose place changes moves, its slots up to the
        length (one gather and one write of those rows; the engine fills a leaving row's place with
        a row from the end, so a step moves as many rows as leave, at most)."""
        if self.buffer_keys is None:
            return
        if not self.row_room or self.zero_tail or len(set(rows)) != len(rows):
            self.batch_select_indices(torch.tensor(rows, dtype=torch.long, device=self.buffer_keys.device))
            return
        moves = [(place, row) for place, row in enumerate(rows) if row != place]
        if moves:
            device = self.buffer_keys.device
            places = torch.tensor([place for place, _ in moves], dtype=torch.long, device=device)
            sources = torch.tensor([row for _, row in moves], dtype=torch.long, device=device)
            for buffer, view in ((self.buffer_keys, self.keys), (self.buffer_values, self.values)):
                moved = view.index_select(0, sources)  # [m, H, length, D]: read before any row is overwritten
                buffer[:, :, : self.length].index_copy_(0, places, moved)
                self.copied_bytes += 2 * _bytes(moved)
        self.rows = len(rows)
        self._expose()

    def append_rows(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        """Rows joining behind the rows in use: ``keys``, ``values`` [m, H, s, D]. Every row is then
        ``max(length, s)`` slots long, zeros in the slots it never wrote (holes: masked, and finite).
        Written in place where the buffers have room for the rows and slots; else one copy of all
        rows into new buffers of ``capacity`` slots at least."""
        count, slots = keys.shape[0], keys.shape[2]
        width = max(self.length, slots)
        in_place = (self.buffer_keys is not None and self.row_room and not self.zero_tail
                    and self.rows + count <= self.buffer_keys.shape[0] and width <= self.capacity)
        if not in_place:
            pieces = [(self.keys, self.values)] if self.buffer_keys is not None and self.rows else []
            self._assemble([*pieces, (keys, values)], max(capacity, self.capacity))
            return
        rows = slice(self.rows, self.rows + count)
        for buffer, part in ((self.buffer_keys, keys), (self.buffer_values, values)):
            if width > self.length:
                buffer[: self.rows, :, self.length : width] = 0
            buffer[rows, :, :slots] = part
            buffer[rows, :, slots:width] = 0
            self.copied_bytes += _bytes(part)
        self.rows += count
        self.length = width
        self._expose()

    def _assemble(self, pieces: list[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> None:
        """Hold the rows of ``pieces`` (keys, values [m, H, s, D] each, in row order), every row
        ``max(s)`` slots long with zeros after its piece's slots: one copy into new buffers of
        ``capacity`` slots at least."""
        width = max(keys.shape[2] for keys, _ in pieces)
        first_keys, first_values = pieces[0]
        self.rows = sum(keys.shape[0] for keys, _ in pieces)
        capacity = max(capacity, width + INITIAL_HEADROOM)
        buffer_keys = self._new_buffer(first_keys, self._row_capacity(), capacity)
        buffer_values = self._new_buffer(first_values, self._row_capacity(), capacity)
        row = 0
        for keys, values in pieces:
            count, slots = keys.shape[0], keys.shape[2]
            for buffer, part in ((buffer_keys, keys), (buffer_values, values)):
                buffer[row : row + count, :, :slots] = part
                if not self.zero_tail:
                    buffer[row : row + count, :, slots:width] = 0  # hole slots: masked, and finite
                self.copied_bytes += _bytes(part)
            row += count
        self.buffer_keys, self.buffer_values = buffer_keys, buffer_values
        self.length = width
        self.is_initialized = True
        self._expose()

    def gather_slots(self, order: torch.Tensor, start: int = 0) -> None:
        """Compaction, in place: move each row's slots ``order`` [M, W - start] (slot indices, each
        >= ``start``) to its slots start..W-1; the first ``start`` slots stay where they are."""
        width = start + order.shape[1]
        index = order[:, None, :, None].to(self.buffer_keys.device)
        for buffer, view in ((self.buffer_keys, self.keys), (self.buffer_values, self.values)):
            gathered = view.gather(2, index.expand(-1, buffer.shape[1], -1, buffer.shape[3]))
            buffer[: self.rows, :, start:width] = gathered
            self.copied_bytes += _bytes(gathered)
        self.length = width
        self._expose()

    def move_slots(self, rows: torch.Tensor, sources: torch.Tensor, places: torch.Tensor, width: int) -> None:
        """Compaction, in place: slot ``sources[i]`` of row ``rows[i]`` goes to its slot ``places[i]``
        (rows, sources, places: [P], on the buffer's device; every source read before any write), the
        other slots stay; then every row is ``width`` slots long."""
        if rows.numel():
            for buffer in (self.buffer_keys, self.buffer_values):
                moved = buffer[rows, :, sources]  # [P, H, D]
                buffer[rows, :, places] = moved
                self.copied_bytes += 2 * _bytes(moved)
        self.length = width
        self._expose()

    def held_bytes(self) -> int:
        """Bytes of the buffers (capacity, not length)."""
        return 0 if self.buffer_keys is None else _bytes(self.buffer_keys) + _bytes(self.buffer_values)


class ConcatLayer(DynamicLayer):
    """Hugging Face's layer (appends by concatenation), counting the bytes each append copies."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.copied_bytes = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self.copied_bytes += _bytes(keys) + _bytes(values)
        return keys, values


class SlotCache(DynamicCache):
    """A ``DynamicCache`` whose layers are ``SlotLayer``s (``layout="slots"``) or counting
    concatenating layers (``layout="concat"``), created as the model first writes them."""

    def __init__(self, layout: str = "slots", zero_tail: bool = False) -> None:
        super().__init__()
        self.reserved = 0  # slots a layer created from now on allocates at its first write (layout "slots")
        self.row_room = 0  # rows a layer created from now on has room for (layout "slots")
        self.zero_tail = zero_tail  # its layers' buffers hold zeros past their length (``SlotLayer``)
        self.layer_class_to_replicate = {"slots": self._slot_layer, "concat": ConcatLayer}[layout]

    def _slot_layer(self) -> SlotLayer:
        return SlotLayer(capacity=self.reserved, zero_tail=self.zero_tail, row_room=self.row_room)

    def copied_bytes(self) -> int:
        return sum(layer.copied_bytes for layer in self.layers)
