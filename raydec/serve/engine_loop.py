"""A replica's scheduler, driven by one thread of the engine process (``engine_worker``).

Requests reach the thread through an inbox (submit, cancel, call); between two steps it admits them,
so requests that arrive while a batch decodes join it together at the next step (continuous
batching). After every step each row's watcher may send progress (partial images, text); a finished
row sends its result and is released. Events go to the watcher's sink; ``after_turn`` runs after
each turn (the engine process sends the turn's events in one message there).

If a step raises, the rows it held get an error and their engine is dropped (the next request
starts a fresh one); if the thread itself dies, ``alive`` turns False and ``on_death`` runs (the
engine process exits, and its replica starts a new one).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, Protocol, TypeVar, Union

from raydec.api.schedulers import Ticket
from raydec.serve.boundary import Event, Failed, RowResult
from raydec.serve.engine_messages import RowTiming
from raydec.speculative.requests import RowState

logger = logging.getLogger("raydec.serve")

ResultT = TypeVar("ResultT", bound=RowResult)
ResultT_co = TypeVar("ResultT_co", bound=RowResult, covariant=True)


class DrivenScheduler(Protocol[ResultT_co]):
    """What the engine loop drives (an ImageScheduler, a CaptionScheduler): requests submitted over
    time as tickets, stepped together, each read once finished and then released."""

    decode_steps: int
    rows_stepped: int
    row_step_times: "collections.deque[float]"  # a decoding row's wait from one decode step to its next (the last ones)

    @property
    def busy(self) -> bool: ...

    def step(self) -> list[Ticket]:
        """One step; the requests that finished in it."""

    def row(self, ticket: Ticket) -> RowState: ...

    def finish_reason(self, ticket: Ticket) -> str: ...

    def result(self, ticket: Ticket) -> ResultT_co: ...

    def cancel(self, ticket: Ticket) -> None: ...

    def release(self, ticket: Ticket) -> None: ...

    def drop(self) -> list[Ticket]:
        """Abandon every engine; the requests they held."""

    def active_rows(self) -> int: ...

    def queued_rows(self) -> int: ...


#: where a watcher's events go: (event, the row's timing when the event ends the row)
Sink = Callable[[Event, Optional[RowTiming]], None]


class Watcher(Generic[ResultT]):
    """One row's link to its request: the events it sends, to ``sink``.

    Subclasses say what a row sends as it progresses and when it finishes; both run on the
    engine thread (a subclass that reads its scheduler holds it)."""

    def __init__(self, sink: Sink, index: int = 0, draft_per_step: int = 0) -> None:
        self.sink = sink
        self.index = index  # the row's place in its request (images: 0..n-1)
        self.draft_per_step = draft_per_step  # draft tokens the row's engine verifies per step (metrics)
        self.ticket: Optional[Ticket] = None  # set on the engine thread once the scheduler took the row
        self.admitted_at: Optional[float] = None  # perf_counter of the row's prefill
        self.first_token_at: Optional[float] = None

    def emit(self, event: Event, final: bool = False) -> None:
        """Send ``event``; ``final``: it ends the row (its timing goes with it)."""
        self.sink(event, RowTiming(self.admitted_at, self.first_token_at, self.draft_per_step) if final else None)

    def progress(self) -> None:
        """Called after each step while the row decodes."""

    def finish(self, result: ResultT) -> None:
        """Called once when the row finished (EOS, length, stop string), with its result."""

    def fail(self, status: int, message: str, code: str) -> None:
        self.emit(Failed(self.index, status, message, code))


# what reaches the engine thread through its inbox
@dataclass(frozen=True)
class _Submit:
    make_ticket: Callable[[], Ticket]
    watcher: Watcher[Any]


@dataclass(frozen=True)
class _Cancel:
    watcher: Watcher[Any]


@dataclass(frozen=True)
class _Call:
    fn: Callable[[], Any]
    reply: Callable[[Any, Optional[BaseException]], None]  # (value, error)


_Message = Union[_Submit, _Cancel, _Call]

#: decode steps whose durations the loop keeps (``stats()["step_times_s"]``: the most recent)
STEP_TIMES = 1024


class EngineLoop(Generic[ResultT]):
    """Drives ``scheduler`` (an ImageScheduler or CaptionScheduler) from one daemon thread."""

    def __init__(self, scheduler: DrivenScheduler[ResultT], after_turn: Callable[[], None] | None = None,
                 on_death: Callable[[BaseException], None] | None = None) -> None:
        self.scheduler = scheduler
        self.after_turn = after_turn  # on the engine thread after each turn (requests in, or a step): send its events
        self.on_death = on_death  # on the engine thread once the loop died, after its rows were failed
        self._inbox: "queue.SimpleQueue[_Message]" = queue.SimpleQueue()
        self._wake = threading.Event()
        self._watchers: dict[Ticket, Watcher[ResultT]] = {}
        self._thread = threading.Thread(target=self._run, name="raydec-engine", daemon=True)
        self._stopping = False
        self.died: Optional[BaseException] = None
        self.cancelled = 0  # rows whose request went away (a client disconnect, a timeout)
        # where the engine thread's time goes: in decode steps (admissions included), and between them
        # (requests in, events out); the last STEP_TIMES steps' durations, for percentiles under load
        self.step_seconds = 0.0
        self.between_steps_seconds = 0.0
        self.step_times: "collections.deque[float]" = collections.deque(maxlen=STEP_TIMES)
        self._last_step_end: Optional[float] = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.died is None

    # -- from the request side (any thread) --------------------------------------------------------

    def submit(self, make_ticket: Callable[[], Ticket], watcher: Watcher[ResultT]) -> None:
        """Run ``make_ticket`` (a scheduler.submit call) on the engine thread; ``watcher`` follows the row."""
        self._inbox.put(_Submit(make_ticket, watcher))
        self._wake.set()

    def cancel(self, watcher: Watcher[ResultT]) -> None:
        self._inbox.put(_Cancel(watcher))
        self._wake.set()

    def call(self, fn: Callable[[], Any], reply: Callable[[Any, Optional[BaseException]], None]) -> None:
        """Run ``fn`` on the engine thread (it owns the scheduler); ``reply(value, error)`` there with its outcome."""
        self._inbox.put(_Call(fn, reply))
        self._wake.set()

    # -- the engine thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain()
                if self.scheduler.busy:
                    self._step()
                if self.after_turn is not None:
                    self.after_turn()
                if not self.scheduler.busy:
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()
        except BaseException as error:  # on_death ends the engine process; its replica starts a new one
            self.died = error
            logger.exception("the engine loop died")
            for watcher in list(self._watchers.values()):
                watcher.fail(503, f"the engine stopped during the request ({type(error).__name__}); retry", "replica_unavailable")
            if self.on_death is not None:
                self.on_death(error)
            raise

    def _drain(self) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            match message:
                case _Submit(make_ticket, watcher):
                    try:
                        ticket = make_ticket()
                    except ValueError as error:  # the request's own fault (its checks raise ValueError)
                        watcher.fail(400, str(error), "invalid_value")
                        continue  # refused: nothing of it is kept
                    except Exception as error:
                        logger.exception("submitting a request failed")
                        watcher.fail(500, f"submitting the request failed: {type(error).__name__}", "engine_failed")
                        continue
                    watcher.ticket = ticket
                    self._watchers[ticket] = watcher
                case _Cancel(watcher):
                    ticket = watcher.ticket
                    if ticket is not None and ticket in self._watchers:
                        self.scheduler.cancel(ticket)
                        if self.scheduler.row(ticket).done:  # it was still queued: it ends now, not in a step
                            self._finished(ticket)
                case _Call(fn, reply):
                    try:
                        value = fn()
                    except Exception as error:
                        reply(None, error)
                    else:
                        reply(value, None)

    def _step(self) -> None:
        started = time.perf_counter()
        if self._last_step_end is not None:  # back to back: the host work between two steps
            self.between_steps_seconds += started - self._last_step_end
        try:
            finished = self.scheduler.step()
        except Exception as error:
            self._fail_step(error)
            self._last_step_end = None
            return
        ended = time.perf_counter()
        self.step_seconds += ended - started
        self.step_times.append(ended - started)
        for ticket in finished:
            self._finished(ticket)
        for watcher in self._watchers.values():
            try:
                watcher.progress()
            except Exception:  # progress is optional: the row still finishes
                logger.exception("sending progress failed")
        self._last_step_end = ended if self.scheduler.busy else None  # idle: waiting for work is not host time

    def _finished(self, ticket: Ticket) -> None:
        """Send a finished row's result (or its cancellation) and release it."""
        watcher = self._watchers.pop(ticket, None)
        try:
            if watcher is None:  # nobody follows it any more
                return
            if self.scheduler.finish_reason(ticket) == "cancelled":  # not "stop": a stop string ended it
                self.cancelled += 1
                watcher.fail(499, "cancelled", "cancelled")
                return
            watcher.admitted_at = self.scheduler.row(ticket).admitted_at
            watcher.finish(self.scheduler.result(ticket))
        except Exception as error:  # a result that cannot be built (VQ decode...) fails its row only
            logger.exception("finishing a row failed")
            if watcher is not None:
                watcher.fail(500, f"finishing the row failed: {type(error).__name__}: {error}", "engine_failed")
        finally:
            self.scheduler.release(ticket)

    def _fail_step(self, error: Exception) -> None:
        """A step raised: its engine's rows get the error, the engine is dropped."""
        bad_input = isinstance(error, ValueError)
        logger.log(logging.WARNING if bad_input else logging.ERROR, "a decode step failed: %s: %s", type(error).__name__, error,
                   exc_info=not bad_input)
        status, code = (400, "invalid_value") if bad_input else (500, "engine_failed")
        for ticket in self.scheduler.drop():
            watcher = self._watchers.pop(ticket, None)
            if watcher is not None:
                watcher.fail(status, f"{type(error).__name__}: {error}" if not bad_input else str(error), code)

    def stats(self) -> dict[str, Any]:
        scheduler = self.scheduler
        return {
            "decode_steps": scheduler.decode_steps,
            "rows_stepped": scheduler.rows_stepped,
            "mean_batch_size": scheduler.rows_stepped / scheduler.decode_steps if scheduler.decode_steps else 0.0,
            "active_rows": self.scheduler.active_rows(),
            "queued_rows": self.scheduler.queued_rows(),
            "following": len(self._watchers),
            "cancelled": self.cancelled,
            "alive": self.alive,
            "step_seconds": self.step_seconds,
            "between_steps_seconds": self.between_steps_seconds,
            "step_times_s": list(self.step_times),
            "row_step_times_s": list(scheduler.row_step_times),
        }

