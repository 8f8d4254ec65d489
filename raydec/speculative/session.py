"""The host-side record of a decode session's rows: what ``DecodeSession`` keeps per request.

Requests are checked and queued as they are submitted (``submit``), get a handle each (counting
from 0 in submission order), are cancelled or released by it, and finish with a reason ("eos",
"length", "cancelled") that ``on_finish`` hears at once. The active rows are in batch order;
when some finish, ``fill_from_the_end`` says where the staying ones go. Nothing here touches the
device: ``DecodeSession`` (``raydec.speculative.engine``) adds the cache, the prefill and the
decode steps on top.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import torch

from raydec.config import SamplingConfig
from raydec.speculative.requests import RowOutput, RowRequest, RowState
from raydec.speculative.sampling import RowSampling


class RowDefaults(Protocol):
    """What a row takes from its engine unless its request brings its own (``Engine`` is one)."""

    sampling: SamplingConfig
    max_new_tokens: int
    eos_token_ids: set[int]


class SessionRows:
    """The rows of one decode session: submitted, queued, active (in batch order), finished.

    Invariants: every handle in ``queue`` and ``active`` has a record in ``rows``, and none is in
    both; a row that finishes (``done``) leaves them (a decoding one when the batch next retires
    its finished rows) and keeps its record until ``release``.
    """

    def __init__(self, engine: RowDefaults, batch_size: int | None = None,
                 on_finish: Callable[[int, RowOutput], None] | None = None) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.engine = engine
        self.batch_size = batch_size
        self.on_finish = on_finish
        self.rows: dict[int, RowState] = {}  # submitted and not yet released
        self._next_handle = 0
        self.queue: list[int] = []
        self.active: list[int] = []
        self._unreported: list[int] = []  # cancelled while queued: finished, not yet returned by ``step``
        self._sampling: tuple[list[int], SamplingConfig | RowSampling] | None = None  # (rows, their sampling)

    def submit(self, request: RowRequest) -> int:
        """Queue a request; returns its handle."""
        handle = self._next_handle
        if request.max_new_tokens is not None and request.max_new_tokens < 1:
            raise ValueError(f"requests[{handle}].max_new_tokens: {request.max_new_tokens} must be >= 1 (None: the engine's)")
        limit = request.max_new_tokens if request.max_new_tokens is not None else self.engine.max_new_tokens
        sampling = request.sampling
        if sampling is not None:
            mine = self.engine.sampling
            for name in ("cfg_scale", "cfg_space"):
                if getattr(sampling, name) != getattr(mine, name):
                    raise ValueError(f"requests[{handle}].sampling.{name}: {getattr(sampling, name)!r} differs from the engine's "
                                     f"{getattr(mine, name)!r} (classifier-free guidance is one for the batch)")
            if sampling.repetition_penalty != 1.0 and sampling.uses_cfg:
                raise ValueError(f"requests[{handle}].sampling.repetition_penalty={sampling.repetition_penalty} is not "
                                 f"supported with classifier-free guidance")
            if sampling == mine:
                sampling = None
        stop = frozenset(self.engine.eos_token_ids) | frozenset(int(t) for t in request.stop_token_ids)
        self.rows[handle] = RowState(request=request, limit=limit, sampling=sampling, stop=stop)
        self._next_handle += 1
        self.queue.append(handle)
        return handle

    def release(self, handle: int) -> RowOutput:
        """A finished row's output, and its record dropped (a long-running session, such as a
        Serve replica's, releases each row it has read so its memory stays flat)."""
        if not self.rows[handle].done:
            raise ValueError(f"release({handle}): the row is still queued or decoding (cancel it first)")
        output = self.output(handle)
        del self.rows[handle]
        return output

    def cancel(self, handle: int) -> None:
        """Stop a request: a queued one finishes now (it never decodes), a decoding one leaves the batch
        at the next step; either is reported (reason "cancelled") by the next ``step``."""
        row = self.rows[handle]
        if row.done:
            return
        row.cancelled = True
        if handle in self.queue:
            self.queue.remove(handle)
            self._finish(handle, "cancelled")
            self._unreported.append(handle)

    @property
    def busy(self) -> bool:
        """``step`` has work: rows are decoding or queued, or a row cancelled while queued is yet to be reported."""
        return bool(self.active or self.queue or self._held_unreported())

    def output(self, handle: int) -> RowOutput:
        row = self.rows[handle]
        return RowOutput(tokens=row.generated, stats=row.stats)

    def _held_unreported(self) -> list[int]:
        """Rows cancelled while queued that ``step`` has not returned and the caller has not released."""
        return [handle for handle in self._unreported if handle in self.rows]

    def _sampling_of(self, handles: list[int], device: torch.device) -> SamplingConfig | RowSampling:
        """The engine's sampling when every row uses it, else the rows' own (kept while they stay)."""
        if all(self.rows[h].sampling is None for h in handles):
            return self.engine.sampling
        if self._sampling is None or self._sampling[0] != handles:
            configs = [self.rows[h].sampling or self.engine.sampling for h in handles]
            self._sampling = (list(handles), RowSampling.of(configs, device))
        return self._sampling[1]

    def _penalised(self, handles: list[int]) -> bool:
        return any((self.rows[h].sampling or self.engine.sampling).repetition_penalty != 1.0 for h in handles)

    def _finish(self, handle: int, reason: str) -> None:
        row = self.rows[handle]
        row.done = True
        row.stats.finish_reason = reason
        if row.admitted_at:
            row.stats.wall_time_s = time.perf_counter() - row.admitted_at
        if self.on_finish is not None:
            self.on_finish(handle, RowOutput(tokens=row.generated, stats=row.stats))

    def _leaving(self) -> tuple[list[int], set[int]]:
        """Finish the active rows that are done: cancelled, a stop token last, or at their length
        cap (in batch order) -> their handles and their places in the batch."""
        finished, leaving = [], set()
        for place, handle in enumerate(self.active):
            row = self.rows[handle]
            if row.cancelled:
                reason = "cancelled"
            elif row.generated and row.generated[-1] in row.stop:
                reason = "eos"
            elif len(row.generated) >= row.limit:
                reason = "length"
            else:
                continue
            self._finish(handle, reason)
            finished.append(handle)
            leaving.add(place)
        return finished, leaving


def fill_from_the_end(rows: int, leaving: set[int]) -> list[int]:
    """The batch order after ``leaving`` rows (of ``rows``) leave: each row keeps its place, except
    that a place left empty among the first ``rows - len(leaving)`` takes a staying row from beyond
    them; so as many rows move as leave, at most, and the cache moves nothing else."""
    size = rows - len(leaving)
    order = list(range(size))
    tail = [i for i in range(size, rows) if i not in leaving]
    for place, row in zip((i for i in range(size) if i in leaving), tail):
        order[place] = row
    return order
