"""When queued rows join a running batch: once the empty places have cost what a refill wastes.

Every row needs its prefill sometime, so that part of a refill is not waste. What is: the fixed
part of a refill (the call overheads, the small prefill forward's inefficiency, the decode step
every active row waits out; the joining rows' cache is written in place behind the active rows'), which is the same whether one row
joins or ten. Leaving places empty costs too: a decode step of a batch with ``free`` of
``batch_size`` places empty does ``free / batch_size`` less work than it could have. The policy
is the rent-or-buy rule over those two measured costs:

    per_row   = seconds of the session's first admission / its rows (a prefill and nothing else)
    overhead  = seconds of the last refill - its rows * per_row
    wasted   += step_seconds * free / batch_size     after each decode step with rows queued

and queued rows join once ``wasted`` reaches ``overhead``. Like renting until the rent paid
equals the price, this never loses more than about twice what the best schedule in hindsight
would. Rows are admitted at once when the batch is empty, or when the free places reach a
quarter of the batch or hold every queued row (so a batch of up to seven, where a quarter is one
place, refills every step, as does the queue's last row); the first refill of a session, with
no overhead measured yet, also runs at once.

The schedule moves only when rows start, never what they decode: a row's tokens depend on its
seed and prompt alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RefillPolicy:
    """The state of the rent-or-buy rule for one session, and the occupancy it kept."""

    prefill_seconds: float | None = None  # per row, measured on the session's first admission
    overhead_seconds: float | None = None  # the last refill's seconds beyond its rows' prefills (None: none yet)
    wasted_seconds: float = 0.0  # seconds of decode work the empty places lost since the last refill
    queued_steps: int = 0  # decode steps run while rows were queued
    queued_fraction: float = 0.0  # active rows / batch_size of those steps, summed

    def should_admit(self, active: int, queued: int, batch_size: int) -> bool:
        """Whether to admit queued rows now, with ``active`` of ``batch_size`` rows decoding and
        ``queued`` waiting."""
        free = batch_size - active
        if queued == 0 or free < 1:
            return False
        if active == 0 or free >= min(max(1, batch_size // 4), queued):
            return True
        return self.overhead_seconds is None or self.wasted_seconds >= self.overhead_seconds

    def admitted(self, seconds: float, rows: int, while_decoding: bool) -> None:
        """Record an admission of ``rows`` that took ``seconds``: the first one of an empty batch
        prices a row's prefill, a refill of a running batch the overhead beyond its prefills."""
        if not while_decoding:
            if self.prefill_seconds is None:
                self.prefill_seconds = seconds / rows
        else:
            self.overhead_seconds = max(0.0, seconds - rows * (self.prefill_seconds or 0.0))
        self.wasted_seconds = 0.0

    def stepped(self, seconds: float, active: int, queued: int, batch_size: int) -> None:
        """Record a decode step of ``seconds`` with ``active`` of ``batch_size`` rows while ``queued`` waited."""
        if queued == 0:
            return
        self.wasted_seconds += seconds * (batch_size - active) / batch_size
        self.queued_steps += 1
        self.queued_fraction += active / batch_size

    @property
    def occupancy(self) -> float | None:
        """Mean active rows / ``batch_size`` over the decode steps run while rows were queued
        (None: no row ever waited)."""
        if not self.queued_steps:
            return None
        return self.queued_fraction / self.queued_steps
