"""A replica's engine in a process of its own (``engine_worker``), seen from the replica.

The replica's interpreter runs HTTP-facing work (Serve's event loop, Ray's threads, PNG encoding);
the engine's runs the decode loop and nothing else, so neither waits for the other's lock. One
socket pair joins them: requests and cancellations go one way; events come back in one message per
engine turn, read by one thread here and handed to each request's asyncio queue.

If the engine process dies, the requests it held end with a 503 (``replica_unavailable``, retry) and
a new engine starts; requests that arrive meanwhile get the same 503. If a new engine cannot start,
``failed`` is set and the replica's health check fails, so Serve replaces the replica.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional

from raydec.serve.boundary import ChatRequest, Event, Failed, ImageDone, ImageRequest, PartialImage, RawImage
from raydec.serve.config import LimitsConfig, ServedModel
from raydec.serve.engine_messages import Call, Cancel, Emitted, Ready, Reply, RowTiming, StartFailed, Stop, Submit

logger = logging.getLogger("raydec.serve")

#: seconds a stopping engine gets to exit before it is killed
STOP_GRACE_S = 5.0


class EngineUnavailable(RuntimeError):
    """The engine process is not running (it died and a new one is starting)."""


@dataclass
class _Route:
    """Where a request's events go."""

    loop: asyncio.AbstractEventLoop
    events: "asyncio.Queue[tuple[Event, Optional[RowTiming]]]"


class EngineProcess:
    """Starts ``served``'s engine process and waits until its model is loaded (``ready``); raises
    RuntimeError naming the model when it cannot start. ``on_batch`` runs on the reader thread."""

    def __init__(self, served: ServedModel, limits: LimitsConfig,
                 on_batch: Callable[[float, Optional[dict[str, int]]], None] | None = None) -> None:
        self.served, self.limits = served, limits
        self.on_batch = on_batch  # (mean batch size, decode steps per plan) after a turn in which a row finished: metrics
        self.restarts = 0
        self.failed: Optional[str] = None  # why a new engine could not start: the health check fails
        self._lock = threading.Lock()
        self._routes: dict[int, _Route] = {}
        self._replies: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._ids = itertools.count(1)
        self._stopping = False
        self._process, self._connection, self.ready = self._start()
        self._reader = threading.Thread(target=self._read, name="raydec-engine-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> Optional[int]:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def alive(self) -> bool:
        """Running, or a new engine starting after one died; False once one could not start, or after ``stop``."""
        return self.failed is None and not self._stopping

    # -- from the replica's event loop ----------------------------------------------------------------

    def submit(self, request: ImageRequest | ChatRequest, seed: int,
               events: "asyncio.Queue[tuple[Event, Optional[RowTiming]]]") -> int:
        """Send a request to the engine; its events (with a finished row's timing) reach ``events``.
        Raises EngineUnavailable while no engine runs."""
        rid = next(self._ids)
        with self._lock:
            connection = self._connection
            if connection is None:
                raise EngineUnavailable(self._unavailable())
            self._routes[rid] = _Route(asyncio.get_running_loop(), events)
            try:
                connection.send(Submit(rid, request, seed))
            except OSError:
                self._routes.pop(rid, None)
                raise EngineUnavailable(self._unavailable()) from None
        return rid

    def cancel(self, rid: int) -> None:
        """The request is over (finished, failed, or its client left): rows still running stop."""
        with self._lock:
            if self._routes.pop(rid, None) is None:
                return
            connection = self._connection
            if connection is not None:
                try:
                    connection.send(Cancel(rid))
                except OSError:
                    pass

    async def call(self, name: str) -> Any:
        """The engine's ``stats`` or ``decoding``; EngineUnavailable while no engine runs."""
        cid = next(self._ids)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            connection = self._connection
            if connection is None:
                raise EngineUnavailable(self._unavailable())
            self._replies[cid] = (loop, future)
            try:
                connection.send(Call(cid, name))
            except OSError:
                self._replies.pop(cid, None)
                raise EngineUnavailable(self._unavailable()) from None
        return await future

    def stop(self) -> None:
        """Stop the engine process and wait for it (killed after STOP_GRACE_S)."""
        self._stopping = True
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.send(Stop())
            except OSError:
                pass
        process = self._process
        if process is not None and process.poll() is None:
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if connection is not None:
            connection.close()

    # -- the engine process ---------------------------------------------------------------------------

    def _start(self) -> tuple[subprocess.Popen, Connection, Ready]:
        """Spawn an engine and wait for its model (raises RuntimeError when it cannot start)."""
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "raydec.serve.engine_worker", "--fd", str(theirs.fileno()), "--model", self.served.name],
                pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        connection = Connection(ours.detach())
        try:
            connection.send((self.served, self.limits))
            message = connection.recv()  # blocks while the model loads (and its plan is made)
        except (EOFError, OSError):
            message = None
        if isinstance(message, Ready):
            return process, connection, message
        connection.close()
        code = process.wait()
        why = message.error if isinstance(message, StartFailed) else f"it exited with status {code} (see the replica's log)"
        raise RuntimeError(f"model {self.served.name!r}: the engine process did not start: {why}")

    def _read(self) -> None:
        """The reader thread: events to their requests, replies to their callers; a new engine when one dies."""
        while True:
            connection = self._connection
            try:
                while connection is not None:
                    self._handle(connection.recv())
            except (EOFError, OSError):
                pass
            if self._stopping:
                return
            self._engine_died()
            try:
                process, connection, ready = self._start()
            except Exception as error:  # reported by the health check, which makes Serve replace the replica
                logger.error("model %s: a new engine did not start: %s", self.served.name, error)
                self.failed = str(error)
                return
            with self._lock:
                self._process, self._connection, self.ready = process, connection, ready
                self.restarts += 1

    def _handle(self, message: Any) -> None:
        match message:
            case Emitted(events, mean_batch, plan_steps):
                deliveries: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
                for rid, event, timing in events:
                    route = self._routes.get(rid)
                    if route is None:
                        continue  # the request is over
                    deliveries.setdefault(route.loop, []).append((route.events, (with_png(event), timing)))
                for loop, items in deliveries.items():
                    try:
                        loop.call_soon_threadsafe(_deliver, items)
                    except RuntimeError:  # that loop is closed
                        pass
                if mean_batch is not None and self.on_batch is not None:
                    self.on_batch(mean_batch, plan_steps)
            case Reply(cid, value, error):
                waiting = self._replies.pop(cid, None)
                if waiting is not None:
                    loop, future = waiting
                    loop.call_soon_threadsafe(_settle, future, value, None if error is None else RuntimeError(error))

    def _engine_died(self) -> None:
        """Every request the engine held ends with a 503; callers waiting for a reply get EngineUnavailable."""
        process, code = self._process, None
        if process is not None:
            try:
                code = process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:  # it closed its socket but lives on: it is no engine of ours any more
                process.kill()
                code = process.wait()
        logger.error("model %s: the engine process exited (status %s); its requests end with 503 and a new engine starts",
                     self.served.name, code)
        with self._lock:
            if self._connection is not None:
                self._connection.close()
            self._connection = None
            routes, self._routes = self._routes, {}
            replies, self._replies = self._replies, {}
        failure = Failed(0, 503, f"model {self.served.name!r}: its engine stopped during the request (exit status {code}); retry",
                         "replica_unavailable")
        for route in routes.values():
            try:
                route.loop.call_soon_threadsafe(_deliver, [(route.events, (failure, None))])
            except RuntimeError:
                pass
        for loop, future in replies.values():
            try:
                loop.call_soon_threadsafe(_settle, future, None, EngineUnavailable(self._unavailable()))
            except RuntimeError:
                pass

    def _unavailable(self) -> str:
        if self.failed is not None:
            return f"model {self.served.name!r}: its engine could not start: {self.failed}"
        return f"model {self.served.name!r}: its engine is restarting; retry"


def with_png(event: Event) -> Event:
    """``event`` with its raw pixels (from the engine) encoded as PNG, here, off the engine and the event loop."""
    match event:
        case PartialImage(index, number, RawImage() as raw):
            return PartialImage(index, number, png_bytes(raw))
        case ImageDone(index, RawImage() as raw, stats):
            return ImageDone(index, png_bytes(raw), stats)
    return event


def png_bytes(raw: RawImage) -> bytes:
    import io

    buffer = io.BytesIO()
    raw.image().save(buffer, format="PNG")
    return buffer.getvalue()


def _deliver(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


def _settle(future: asyncio.Future, value: Any, error: Optional[BaseException]) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
