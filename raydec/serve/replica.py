"""Model replicas: the Serve deployment of one served model. Its engine (target, draft, scheduler
and decode loop) runs in a process of its own (``engine_process``); the replica turns requests from
the ingress into messages to it and streams its events back (``boundary``).

``ImageReplica`` serves a text-to-image model (``generate_images``: an ``ImageRequest``), ``ChatReplica``
a vision-language model (``chat``: a ``ChatRequest``); ``replica_class`` picks one for a task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import time
from typing import Any, AsyncIterator, ClassVar, Optional

from raydec.serve.boundary import ChatDone, ChatEvent, ChatRequest, Event, Failed, ImageDone, ImageEvent, ImageRequest, ModelInfo
from raydec.serve.config import LimitsConfig, ServedModel
from raydec.serve.engine_messages import RowTiming
from raydec.serve.engine_process import EngineProcess, EngineUnavailable
from raydec.serve.metrics import ReplicaMetrics

logger = logging.getLogger("raydec.serve")


class ModelReplica:
    """The Serve deployment of one served model (see ``app.build_app`` for its options): what
    both tasks share. A subclass adds its task's request method."""

    task: ClassVar[str]

    def __init__(self, served: ServedModel, limits: LimitsConfig) -> None:
        if served.task != self.task:
            raise ValueError(f"{type(self).__name__} serves task {self.task!r}, not {served.task!r}")
        logging.getLogger("raydec").setLevel(logging.INFO)
        started = time.perf_counter()
        self.served, self.limits = served, limits
        self.metrics = ReplicaMetrics(served.name)
        self.engine = EngineProcess(served, limits, on_batch=self._batch_figures)  # loads the model and makes its plan, in its own process
        self.requests = 0
        logger.info("%s (replica %d, engine process %s, %.1f s in all)", self.engine.ready.summary, os.getpid(), self.engine.pid,
                    time.perf_counter() - started)

    def __del__(self) -> None:  # Serve calls it when it stops the replica
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()

    def _batch_figures(self, mean_batch_size: float, plan_steps: Optional[dict[str, int]]) -> None:
        self.metrics.record_batch(mean_batch_size)
        if plan_steps is not None:
            self.metrics.record_plan_steps(plan_steps)

    # -- what the ingress calls ------------------------------------------------------------------

    def info(self) -> ModelInfo:
        """What the API needs to know of the model."""
        return dataclasses.replace(self.engine.ready.info, pid=os.getpid())

    async def stats(self) -> dict[str, Any]:
        """The engine's figures (``EngineHost.stats``) with this replica's totals and CPU seconds (its own process's);
        only the latter while a new engine starts."""
        try:
            engine = await self.engine.call("stats")
        except EngineUnavailable:
            engine = {"alive": False}
        return {**engine, **self.metrics.snapshot(), "requests": self.requests, "pid": os.getpid(), "engine_pid": self.engine.pid,
                "engine_restarts": self.engine.restarts, "replica_cpu_s": time.process_time()}

    async def decoding(self) -> dict[str, Any]:
        """What requests that name no method decode with (``EngineHost.decoding``)."""
        return await self.engine.call("decoding")

    def check_health(self) -> None:
        """Serve's health check: fails once the engine could not be (re)started (Serve then replaces the replica)."""
        if not self.engine.alive:
            raise RuntimeError(f"the engine of model {self.served.name!r} died: {self.engine.failed}")

    async def _run(self, request: ImageRequest | ChatRequest, seed: int, rows: int) -> AsyncIterator[Event]:
        """Send ``request`` to the engine and yield its events until each of its ``rows`` has finished or one
        failed; rows still running when the caller goes away (a client disconnect cancels this generator)
        are cancelled."""
        self.requests += 1
        events: asyncio.Queue[tuple[Event, Optional[RowTiming]]] = asyncio.Queue()
        submitted_at = time.perf_counter()
        try:
            rid = self.engine.submit(request, seed, events)
        except EngineUnavailable as error:
            yield Failed(0, 503, str(error), "replica_unavailable")
            return
        finished = 0
        try:
            while finished < rows:
                event, timing = await events.get()
                yield event
                match event:
                    case Failed():
                        return
                    case ImageDone() | ChatDone():
                        finished += 1
                        if timing is not None:
                            self.metrics.finished(submitted_at, timing, event.stats)
        finally:
            self.engine.cancel(rid)


class ImageReplica(ModelReplica):
    """A text-to-image model's replica."""

    task = "t2i"

    async def generate_images(self, request: ImageRequest) -> AsyncIterator[ImageEvent]:
        """One image request (n rows): partial images (if asked) and each image as it finishes."""
        seed = request.seed if request.seed is not None else secrets.randbelow(2**63 - request.n)
        async for event in self._run(request, seed, request.n):
            yield event  # type: ignore[misc]


class ChatReplica(ModelReplica):
    """A vision-language model's replica."""

    task = "caption"

    async def chat(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        """One chat: text deltas (when streamed) and the answer."""
        seed = request.seed if request.seed is not None else secrets.randbelow(2**63)
        async for event in self._run(request, seed, 1):
            yield event  # type: ignore[misc]


REPLICAS: dict[str, type[ModelReplica]] = {"t2i": ImageReplica, "caption": ChatReplica}


def replica_class(task: str) -> type[ModelReplica]:
    """The deployment class of a served model's task."""
    return REPLICAS[task]
