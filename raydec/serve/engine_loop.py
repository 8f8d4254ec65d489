"""A replica's engine session, driven by one background thread.

Requests reach the thread through an inbox (submit, cancel); between two steps it admits them,
so a request that arrives while a batch decodes joins it (continuous batching). After every
step each row's watcher may send progress (partial images, text); a finished row sends its
result and is released. Events reach the request's asyncio task through its event loop.

If a step raises, the rows it held get an error and their engine is dropped (the next request
starts a fresh one); if the thread itself dies, ``alive`` turns False and the replica's health
check fails, so Serve replaces the replica.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Any, Callable, Optional

from raydec.api.sessions import Ticket

logger = logging.getLogger("raydec.serve")


class Watcher:
    """One row's link to its request: the events it sends, on the request's event loop.

    Subclasses say what a row sends as it progresses and when it finishes; both run on the
    engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue, index: int = 0) -> None:
        self.loop = loop
        self.events = events
        self.index = index  # the row's place in its request (images: 0..n-1)
        self.ticket: Optional[Ticket] = None
        self.submitted_at = time.perf_counter()
        self.admitted_at: Optional[float] = None  # perf_counter of the row's prefill
        self.first_token_at: Optional[float] = None

    def emit(self, event: dict[str, Any]) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the request's loop is gone (its client left)
            pass

    def progress(self, session: Any) -> None:
        """Called after each step while the row decodes."""

    def finish(self, session: Any, result: Any) -> None:
        """Called once when the row finished (EOS, length, stop string), with its result."""

    def fail(self, status: int, message: str, code: str) -> None:
        self.emit({"kind": "error", "index": self.index, "status": status, "message": message, "code": code})


class EngineLoop:
    """Drives ``session`` (an ImageSession or CaptionSession) from one daemon thread."""

    def __init__(self, session: Any, on_finish: Callable[[Watcher, Any], None] | None = None) -> None:
        self.session = session
        self.on_finish = on_finish  # (watcher, result) on the engine thread: metrics
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._watchers: dict[Ticket, Watcher] = {}
        self._thread = threading.Thread(target=self._run, name="raydec-engine", daemon=True)
        self._stopping = False
        self.died: Optional[BaseException] = None
        self.cancelled = 0  # rows whose request went away (a client disconnect, a timeout)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.died is None

    # -- from the request side (any thread) --------------------------------------------------------

    def submit(self, make_ticket: Callable[[], Ticket], watcher: Watcher) -> None:
        """Run ``make_ticket`` (a session.submit call) on the engine thread; ``watcher`` follows the row."""
        self._inbox.put(("submit", make_ticket, watcher))
        self._wake.set()

    def cancel(self, watcher: Watcher) -> None:
        self._inbox.put(("cancel", None, watcher))
        self._wake.set()

    def call(self, fn: Callable[[], Any]) -> "asyncio.Future[Any]":
        """Run ``fn`` on the engine thread (it owns the session); the result as an awaitable."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._inbox.put(("call", fn, (loop, future)))
        self._wake.set()
        return future

    # -- the engine thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain()
                if self.session.busy:
                    self._step()
                else:
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()
        except BaseException as error:  # the health check reports it; Serve replaces the replica
            self.died = error
            logger.exception("the engine loop died")
            for watcher in list(self._watchers.values()):
                watcher.fail(500, f"the engine loop died: {type(error).__name__}", "engine_failed")
            raise

    def _drain(self) -> None:
        while True:
            try:
                kind, fn, watcher = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                try:
                    watcher.ticket = fn()
                except ValueError as error:  # the request's own fault (its checks raise ValueError)
                    watcher.fail(400, str(error), "invalid_value")
                    continue  # refused: nothing of it is kept
                except Exception as error:
                    logger.exception("submitting a request failed")
                    watcher.fail(500, f"submitting the request failed: {type(error).__name__}", "engine_failed")
                    continue
                self._watchers[watcher.ticket] = watcher
            elif kind == "cancel":
                if watcher.ticket is not None and watcher.ticket in self._watchers:
                    self.session.cancel(watcher.ticket)
                    if self.session.row(watcher.ticket).done:  # it was still queued: it ends now, not in a step
                        self._finished(watcher.ticket)
            elif kind == "call":
                loop, future = watcher
                try:
                    value = fn()
                    loop.call_soon_threadsafe(_settle, future, value, None)
                except Exception as error:
                    loop.call_soon_threadsafe(_settle, future, None, error)

    def _step(self) -> None:
        try:
            finished = self.session.step()
        except Exception as error:
            self._fail_step(error)
            return
        for ticket in finished:
            self._finished(ticket)
        for watcher in self._watchers.values():
            try:
                watcher.progress(self.session)
            except Exception:  # progress is optional: the row still finishes
                logger.exception("sending progress failed")

    def _finished(self, ticket: Ticket) -> None:
        """Send a finished row's result (or its cancellation) and release it."""
        watcher = self._watchers.pop(ticket, None)
        try:
            if watcher is None:  # nobody follows it any more
                return
            if self.session.row(ticket).stats.finish_reason == "cancelled" and not self._stopped_by_text(ticket):
                self.cancelled += 1
                watcher.fail(499, "cancelled", "cancelled")
                return
            watcher.admitted_at = self.session.row(ticket).admitted_at
            result = self.session.result(ticket)
            watcher.finish(self.session, result)
            if self.on_finish is not None:
                self.on_finish(watcher, result)
        except Exception as error:  # a result that cannot be built (VQ decode...) fails its row only
            logger.exception("finishing a row failed")
            if watcher is not None:
                watcher.fail(500, f"finishing the row failed: {type(error).__name__}: {error}", "engine_failed")
        finally:
            self.session.release(ticket)

    def _stopped_by_text(self, ticket: Ticket) -> bool:
        return ticket in getattr(self.session, "stopped", {})

    def _fail_step(self, error: Exception) -> None:
        """A step raised: its engine's rows get the error, the engine is dropped."""
        bad_input = isinstance(error, ValueError)
        logger.log(logging.WARNING if bad_input else logging.ERROR, "a decode step failed: %s: %s", type(error).__name__, error,
                   exc_info=not bad_input)
        status, code = (400, "invalid_value") if bad_input else (500, "engine_failed")
        for ticket in self.session.drop():
            watcher = self._watchers.pop(ticket, None)
            if watcher is not None:
                watcher.fail(status, f"{type(error).__name__}: {error}" if not bad_input else str(error), code)

    def stats(self) -> dict[str, Any]:
        session = self.session
        return {
            "decode_steps": session.decode_steps,
            "rows_stepped": session.rows_stepped,
            "mean_batch_size": session.rows_stepped / session.decode_steps if session.decode_steps else 0.0,
            "active_rows": self.session.active_rows(),
            "queued_rows": self.session.queued_rows(),
            "following": len(self._watchers),
            "cancelled": self.cancelled,
            "alive": self.alive,
        }


def _settle(future: asyncio.Future, value: Any, error: Optional[BaseException]) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
