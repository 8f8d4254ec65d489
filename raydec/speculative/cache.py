"""RaggedCache: a batched KV cache in which every row has its own committed length.

One Hugging Face cache (``SlotCache``: each layer's keys/values written in place into a
preallocated buffer, see raydec/speculative/slots.py) holds ``[M, H, S, D]`` keys/values for all
model rows; all rows share the physical length ``S``. On top of it we keep, per row,

    valid:         [M, S] bool  slot s holds a committed token of this row   (on the model's device)
    next_position: [M]    long  position id of the row's next token          (on the model's device)
    lengths:       M ints       valid slots per row, on the host (from the counts the engine
                                reads back each step), so trimming and compaction never read
                                the device

Each step the window (a draft tree) is appended for every row; after verification a row keeps
only its root and accepted nodes, the other slots become *holes*. Attention masks hide holes,
so correctness never depends on compaction; compaction (gathering each row's valid slots to the
left and cropping the tail) only bounds memory and attention cost. A row's left padding (its
prompt shorter than the batch's widest) stays where it is, holes in front of the row, so
compaction never moves a prompt: it moves the slots decoded since the last one.
"""

from __future__ import annotations

from typing import Literal

import torch

from raydec.speculative.slots import SlotCache, SlotLayer

#: how a cache layer stores its keys and values: "slots" (written in place, see slots.py) or "concat"
#: (Hugging Face's append by concatenation, which copies the layer's cache at every forward)
CacheLayout = Literal["slots", "concat"]
DEFAULT_LAYOUT: CacheLayout = "slots"


class RaggedCache:
    """Valid-slot bookkeeping over an HF cache (see module docstring)."""

    def __init__(
        self, num_rows: int, compaction: Literal["auto", "always", "never"] = "auto", device: torch.device | str = "cpu",
        layout: CacheLayout = DEFAULT_LAYOUT, zero_tail: bool = False,
    ) -> None:
        self.kv = SlotCache(layout, zero_tail)  # zero_tail: buffers hold zeros past the length (``SlotLayer``)
        self.layout = layout
        self.device = torch.device(device)
        self.valid = torch.zeros(num_rows, 0, dtype=torch.bool, device=self.device)  # [M, S]
        self.next_position = torch.zeros(num_rows, dtype=torch.long, device=self.device)  # [M]
        self.lengths: list[int] = [0] * num_rows
        self.pads: list[int] = [0] * num_rows  # per row, the holes in front of it (left padding): they stay where they are
        self.clean: list[int] = [0] * num_rows  # per row, slots valid from its pad on (host): compaction leaves them in place
        self.next_positions: list[int] = [0] * num_rows  # next_position on the host
        self.compaction = compaction

    # -- shape ---------------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        return self.valid.shape[0]

    @property
    def length(self) -> int:
        """Physical slots S (valid or not)."""
        return self.valid.shape[1]

    @property
    def max_next_position(self) -> int:
        """The largest next position id of any row (host)."""
        return max(self.next_positions, default=0)

    def nbytes(self) -> int:
        """Bytes the keys and values hold now (every layer, every model row, holes and a slot
        buffer's room to grow included)."""
        return sum(
            layer.held_bytes() if isinstance(layer, SlotLayer)
            else sum(t.numel() * t.element_size() for t in (layer.keys, layer.values) if t is not None and t.numel())
            for layer in self.kv.layers
        )

    def copied_bytes(self) -> int:
        """Bytes the layers have written or copied so far (new slots, growth, compaction, rows
        leaving or joining): the benches read its growth per step."""
        return self.kv.copied_bytes()

    # -- masks and positions for a new window --------------------------------------------------

    def attention_mask(self, window_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Additive 4-D mask for a window forward.

        window_mask: [M, N, N] bool (query i may see window node j)
        returns:     [M, 1, N, S + N] with 0 where attention is allowed and dtype-min elsewhere
        """
        rows, width, _ = window_mask.shape
        prefix = self.valid.unsqueeze(1).expand(rows, width, self.length)  # [M, N, S]
        allowed = torch.cat([prefix, window_mask.to(self.device)], dim=2)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask.unsqueeze(1)

    def window_positions(self, depth: torch.Tensor) -> torch.Tensor:
        """Position ids of the window nodes: next position + depth. depth: [M, N] -> [M, N]"""
        return self.next_position.unsqueeze(1) + depth.to(self.device)

    # -- updates -------------------------------------------------------------------------------

    def reserve(self, slots: int) -> None:
        """Room for ``slots`` physical slots per layer before a buffer grows (written in place);
        before the first forward, the layers' buffers are allocated that large."""
        self.kv.reserved = max(self.kv.reserved, slots)
        for layer in self.kv.layers:
            if isinstance(layer, SlotLayer):
                layer.reserve(slots)

    def start(self, valid: torch.Tensor, next_position: torch.Tensor) -> None:
        """After the prefill forward: which prompt slots are real ([M, S]) and next positions ([M]),
        both as the host built them."""
        pads = (~valid).long().cumprod(dim=1).sum(dim=1)  # [M]
        in_front = torch.arange(valid.shape[1], device=valid.device).unsqueeze(0) < pads.unsqueeze(1)
        self.pads = pads.tolist()
        self.clean = ((valid | in_front).long().cumprod(dim=1).sum(dim=1) - pads).tolist()  # a left-padded prompt: all of it
        self.lengths = valid.sum(dim=1).tolist()
        self.next_positions = next_position.tolist()
        self.valid = valid.to(self.device, copy=True)
        self.next_position = next_position.to(self.device, torch.long, copy=True)
        self._check_physical_length()

    def commit(self, keep: torch.Tensor, kept: list[int] | None = None, last_kept: int | None = None) -> None:
        """The last N slots were just appended by a window forward; keep the marked ones.

        keep: [M, N] bool (root and accepted nodes). Kept nodes lie on one root-to-node path,
        so the row's next position advances by their count. kept: that count per row and
        last_kept: the highest kept window slot of any row, as the host knows them (None: read
        back from ``keep``).
        """
        if kept is None:
            kept = keep.sum(dim=1).tolist()
        if last_kept is None:
            used = keep.any(dim=0).nonzero()
            last_kept = int(used.max()) if used.numel() else -1
        self.valid = torch.cat([self.valid, keep.to(self.device)], dim=1)
        self.next_position = self.next_position + keep.to(self.device).sum(dim=1)
        self.lengths = [have + new for have, new in zip(self.lengths, kept)]
        self.next_positions = [have + new for have, new in zip(self.next_positions, kept)]
        self._check_physical_length()
        self._trim_tail(keep.shape[1] - 1 - last_kept)
        if self._should_compact():
            self.compact()

    def reserve_rows(self, rows: int) -> None:
        """Room for ``rows`` model rows in every layer's buffers (a decode batch's cache): rows then
        leave and join in place, without a copy of the rest of the batch (``SlotLayer``)."""
        self.kv.row_room = max(self.kv.row_room, rows)
        for layer in self.kv.layers:
            if isinstance(layer, SlotLayer):
                layer.reserve_rows(rows)

    def select_rows(self, rows: list[int]) -> None:
        """Keep only the given model rows, in that order (finished rows leave the batch)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in self.kv.layers:
            if isinstance(layer, SlotLayer):
                layer.keep_rows(rows)
            elif layer.keys is not None and layer.keys.numel():
                layer.batch_select_indices(index.to(layer.keys.device))
        self.lengths = [self.lengths[r] for r in rows]
        self.next_positions = [self.next_positions[r] for r in rows]
        self.clean = [self.clean[r] for r in rows]
        self.pads = [self.pads[r] for r in rows]
        self.valid = self.valid[index]
        self.next_position = self.next_position[index]

    def append_rows(self, other: "RaggedCache") -> None:
        """Add ``other``'s rows behind this cache's (rows joining a running batch). The shorter
        cache gets hole slots at its end, so both share one physical length."""
        width = max(self.length, other.length)

        def join(a: torch.Tensor, b: torch.Tensor, slot_dim: int) -> torch.Tensor:
            pad = [0, 0] * (a.dim() - 1 - slot_dim)
            a, b = (torch.nn.functional.pad(t, pad + [0, width - t.shape[slot_dim]]) for t in (a, b))
            return torch.cat([a, b.to(a.device, a.dtype)], dim=0)

        self.clean = self.clean + other.clean  # the joining rows' holes after their slots do not count
        self.pads = self.pads + other.pads
        for mine, theirs in zip(self.kv.layers, other.kv.layers):
            if isinstance(mine, SlotLayer):  # in place where the buffers have room, else one copy of both caches' rows
                mine.append_rows(theirs.keys.to(mine.keys), theirs.values.to(mine.values),
                                 theirs.capacity if isinstance(theirs, SlotLayer) else 0)
                continue
            mine.keys, mine.values = join(mine.keys, theirs.keys, 2), join(mine.values, theirs.values, 2)
            mine.copied_bytes += 2 * mine.keys.numel() * mine.keys.element_size()
        self.valid = join(self.valid, other.valid, 1)
        self.next_position = torch.cat([self.next_position, other.next_position.to(self.device)])
        self.lengths = self.lengths + other.lengths
        self.next_positions = self.next_positions + other.next_positions
        self._check_physical_length()

    def compact(self) -> None:
        """Gather every row's valid slots to the left of its tail (stable order) and crop the tail. A
        row's pad stays in front of it, and the row moves only its valid slots past its clean prefix
        (``pads``, ``clean``)."""
        ends = [pad + n for pad, n in zip(self.pads, self.lengths)]  # a row's slots once compacted
        width = max(ends, default=0)
        if all(end == self.length for end in ends):
            return
        pads = torch.tensor(self.pads, device=self.device).unsqueeze(1)
        stays = self.valid | (torch.arange(self.length, device=self.device).unsqueeze(0) < pads)  # [M, S]
        order = torch.argsort((~stays).to(torch.int8), dim=1, stable=True)[:, :width]  # [M, width]
        # order[r, :pads[r] + clean[r]] is 0..pads[r] + clean[r] - 1: those slots stay
        clean = [pad + min(c, n) for pad, c, n in zip(self.pads, self.clean, self.lengths)]
        start = min(clean, default=0)
        moves = None if start == max(clean, default=0) else self._moves(order, clean, ends)
        for layer in self.kv.layers:
            if layer.keys is None or layer.keys.numel() == 0:
                continue
            if isinstance(layer, SlotLayer):
                if moves is None:  # one clean prefix for every row (a CFG pair, rows of one age): one gather past it
                    layer.gather_slots(order[:, start:], start)
                else:
                    layer.move_slots(*moves, width)
                continue
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, index.to(layer.keys.device))
            layer.values = layer.values.gather(2, index.to(layer.values.device))
            layer.copied_bytes += 2 * layer.keys.numel() * layer.keys.element_size()
        self.valid = self.valid.gather(1, order)
        self.clean = list(self.lengths)

    # -- internals -----------------------------------------------------------------------------

    def _moves(self, order: torch.Tensor, clean: list[int], ends: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows of different ages: each row moves only its valid slots past its own clean prefix,
        slots clean[r]..ends[r]-1 from slots order[r, ...] (the slots decoded since its last
        compaction; the slots past its end are holes). -> rows, sources, places [P] on the device"""
        counts = torch.tensor([end - c for c, end in zip(clean, ends)])
        rows = torch.repeat_interleave(torch.arange(len(counts)), counts)  # [P]
        places = torch.tensor(clean)[rows] + torch.arange(int(counts.sum())) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        rows, places = rows.to(self.device), places.to(self.device)
        return rows, order[rows, places], places

    def _physical_length(self) -> int:
        return self.kv.get_seq_length() if len(self.kv.layers) else self.length

    def _check_physical_length(self) -> None:
        physical = self._physical_length()
        if len(self.kv.layers) and physical != self.length:
            raise RuntimeError(f"KV cache has {physical} slots but the valid mask tracks {self.length}")

    def _trim_tail(self, drop: int) -> None:
        """Crop the ``drop`` trailing slots that no row uses (cheap: no copy)."""
        if drop > 0:
            if len(self.kv.layers):
                self.kv.crop(-drop)
            self.valid = self.valid[:, : self.length - drop]

    def _should_compact(self) -> bool:
        if self.compaction == "never" or self.length == 0:
            return False
        if self.compaction == "always":
            return True
        removable = self.length - max((pad + n for pad, n in zip(self.pads, self.lengths)), default=0)
        # auto: compact once the columns it frees are a real share of what it moves. Concatenated,
        # it copies the whole cache; written in place, only the slots past the rows' pads and clean
        # prefixes (decoded since the last compaction): so the holes stay within a share of the
        # decoded slots, which admission reserves room for, whatever the prompt's length
        kept = min((pad + c for pad, c in zip(self.pads, self.clean)), default=0)
        moved = self.length if self.layout == "concat" else self.length - kept
        return removable > max(32, moved // 4)
