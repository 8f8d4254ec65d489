"""Model replicas: one target (and draft) on its device, one scheduler in a background loop,
requests from the ingress streamed back as events (``boundary``).

``ImageReplica`` serves a text-to-image model (``generate_images``: an ``ImageRequest``), ``ChatReplica``
a vision-language model (``chat``: a ``ChatRequest``); ``replica_class`` picks one for a task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
import asyncio
import logging
import os
import secrets
import time
from io import BytesIO
from typing import Any, AsyncIterator, ClassVar, Generic, Optional, TypeVar

import torch
from PIL import Image

from raydec.api.captions import CaptionResult
from raydec.api.live_plan import bucket_sizes
from raydec.api.tuner import shape_label
from raydec.api.images import ImageResult
from raydec.api.schedulers import CaptionScheduler, ImageScheduler, Ticket
from raydec.config import JACOBI_METHODS, DType
from raydec.runtime.planning import describe_plan, plan_replica, plan_replica_buckets
from raydec.serve.boundary import (ChatDone, ChatEvent, ChatRequest, Event, Failed, ImageDone, ImageEvent, ImageRequest, ModelInfo,
                                   PartialImage, RowStats, TextDelta)
from raydec.serve.config import LimitsConfig, ServedModel
from raydec.serve.engine_loop import EngineLoop, Watcher
from raydec.serve.metrics import ReplicaMetrics, draft_tokens_per_step

logger = logging.getLogger("raydec.serve")

TORCH_DTYPES: dict[DType, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16,
}


def png_bytes(image: Image.Image) -> bytes:
    buffer = BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class ImageWatcher(Watcher[ImageResult]):
    """Sends up to ``partial_images`` partial images, at evenly spaced committed rows, then the image."""

    def __init__(self, scheduler: ImageScheduler, loop: asyncio.AbstractEventLoop, events: asyncio.Queue[Event], index: int,
                 partial_images: int, draft_per_step: int) -> None:
        super().__init__(loop, events, index, draft_per_step)
        self.scheduler = scheduler
        self.partial_images = partial_images
        self.sent = 0

    def progress(self) -> None:
        if self.sent >= self.partial_images or self.ticket is None:
            return
        scheduler = self.scheduler
        done, rows = scheduler.rows_done(self.ticket), scheduler.rows_per_image(self.ticket)
        if done >= rows:
            return  # the final image follows
        due = done * (self.partial_images + 1) // rows  # partial images due by now
        if due > self.sent:
            self.emit(PartialImage(self.index, self.sent, png_bytes(scheduler.partial_image(self.ticket))))
            self.sent += 1

    def finish(self, result: ImageResult) -> None:
        self.emit(ImageDone(self.index, png_bytes(result.image), RowStats.of(result)))


class ChatWatcher(Watcher[CaptionResult]):
    """Sends the answer's new text after a step (held back while it may be the start of a stop
    string or of a multi-byte character), at most once per ``interval`` seconds (the first text at
    once), then the whole answer."""

    def __init__(self, scheduler: CaptionScheduler, loop: asyncio.AbstractEventLoop, events: asyncio.Queue[Event], stream: bool,
                 stop: tuple[str, ...], draft_per_step: int, interval: float = 0.0) -> None:
        super().__init__(loop, events, 0, draft_per_step)
        self.scheduler = scheduler
        self.stream = stream
        self.interval = interval
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.sent = ""
        self.sent_at: Optional[float] = None  # perf_counter of the last text sent
        self.prompt_tokens = 0  # set on the engine thread when the row is submitted

    def progress(self) -> None:
        if self.ticket is None or not self.scheduler.tokens(self.ticket):
            return
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if not self.stream:
            return
        now = time.perf_counter()
        if self.sent_at is not None and now - self.sent_at < self.interval:
            return  # the text waits for the next step past the interval, or for the answer
        text = self.scheduler.text(self.ticket)
        ready = text[: len(text) - self.hold] if self.hold else text
        ready = ready.rstrip("\ufffd")  # an incomplete character
        if ready.startswith(self.sent) and len(ready) > len(self.sent):
            self.emit(TextDelta(ready[len(self.sent):]))
            self.sent, self.sent_at = ready, now

    def finish(self, result: CaptionResult) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        text = result.caption
        if self.stream and text.startswith(self.sent) and len(text) > len(self.sent):
            self.emit(TextDelta(text[len(self.sent):]))
        self.emit(ChatDone(text, result.finish_reason, RowStats.of(result), self.prompt_tokens, result.num_tokens))


SchedulerT = TypeVar("SchedulerT", ImageScheduler, CaptionScheduler)
ResultT = TypeVar("ResultT", ImageResult, CaptionResult)
EventT = TypeVar("EventT", ImageEvent, ChatEvent)


class ModelReplica(ABC, Generic[SchedulerT, ResultT]):
    """The Serve deployment of one served model (see ``app.build_app`` for its options): what
    both tasks share. A subclass opens its task's scheduler and adds its request method."""

    task: ClassVar[str]

    def __init__(self, served: ServedModel, limits: LimitsConfig) -> None:
        if served.task != self.task:
            raise ValueError(f"{type(self).__name__} serves task {self.task!r}, not {served.task!r}")
        logging.getLogger("raydec").setLevel(logging.INFO)
        torch.set_num_threads(served.torch_threads)
        device = "cuda" if served.gpus_per_worker > 0 else None
        started = time.perf_counter()
        self.plan = plan_replica(served.processor_config())  # "auto" batch size and draft shape: from the shape cache, else measured now
        self.bucket_plans = plan_replica_buckets(served.processor_config(), self.plan, bucket_sizes(self.plan.batch_size)) \
            if follows_batch(served) and self.plan.batch_size > 1 else {}
        served = served.model_copy(update={"batch_size": self.plan.batch_size, "decode": self.plan.decode})
        self.served, self.limits = served, limits
        self.scheduler: SchedulerT = self._open(served, TORCH_DTYPES[served.dtype], device)
        self.scheduler.follow_plans(self.bucket_plans)  # the session of requests that name no method follows its live batch
        self.metrics = ReplicaMetrics(served.name)
        self.loop: EngineLoop[ResultT] = EngineLoop(self.scheduler, on_finish=self._finished)
        self.loop.start()
        self.requests = 0
        logger.info("model %s (%s, %s) ready in %.1f s on %s: %s", served.name, served.task, served.model,
                    time.perf_counter() - started, device or "cpu", describe_plan(self.plan))

    @abstractmethod
    def _open(self, served: ServedModel, dtype: torch.dtype, device: str | None) -> SchedulerT:
        """The task's scheduler over the served model, loaded on ``device``."""

    def _finished(self, watcher: Watcher[ResultT], result: ResultT) -> None:
        self.metrics.finished(watcher, result)
        self.metrics.record_batch(self.loop.stats()["mean_batch_size"])
        if self.scheduler.live is not None:
            self.metrics.record_plan_steps(self.scheduler.live.steps)

    # -- what the ingress calls ------------------------------------------------------------------

    def info(self) -> ModelInfo:
        """What the API needs to know of the model."""
        return ModelInfo(task=self.served.task, method=self.scheduler.base.method, pid=os.getpid())

    def stats(self) -> dict[str, Any]:
        return {**self.loop.stats(), **self.metrics.snapshot(), "requests": self.requests, "pid": os.getpid(), **self.decoding()}

    def decoding(self) -> dict[str, Any]:
        """What requests that name no method decode with: the method, its draft shape and the batch size,
        and the plan they come from (``DecodePlan.record``: where each was taken from, the shape cache or
        measured at start, and the figures); ``live_plan``: for a replica that follows its live batch, the plan
        in use, decode steps per plan and the plan of each batch bucket (``LivePlans.record``), else None."""
        base, live = self.scheduler.base, self.scheduler.live
        return {"method": base.method, "shape": shape_label(base), "batch_size": self.scheduler.batch_size, "plan": self.plan.record(),
                "live_plan": live.record() if live is not None else None}

    def check_health(self) -> None:
        """Serve's health check: fails once the engine loop has died (Serve then replaces the replica)."""
        if not self.loop.alive:
            raise RuntimeError(f"the engine loop of model {self.served.name!r} died: {self.loop.died!r}")

    async def _follow(self, events: asyncio.Queue[EventT], watchers: list[Watcher[ResultT]]) -> AsyncIterator[EventT]:
        """The request's events until each row has finished or one failed; rows still running
        when the caller goes away (a client disconnect cancels this generator) are cancelled."""
        finished = 0
        try:
            while finished < len(watchers):
                event = await events.get()
                yield event
                match event:
                    case Failed():
                        return
                    case ImageDone() | ChatDone():
                        finished += 1
        finally:
            for watcher in watchers:
                self.loop.cancel(watcher)


class ImageReplica(ModelReplica[ImageScheduler, ImageResult]):
    """A text-to-image model's replica."""

    task = "t2i"

    def _open(self, served: ServedModel, dtype: torch.dtype, device: str | None) -> ImageScheduler:
        return ImageScheduler(served.model, served.decode, dtype=dtype, device=device, batch_size=served.batch_size,
                              vqgan_path=served.vqgan_path, s3=served.s3)

    def info(self) -> ModelInfo:
        height, width = self.scheduler.target.image_size
        return ModelInfo(task=self.served.task, method=self.scheduler.base.method, pid=os.getpid(),
                         size=f"{width}x{height}", sizes=self.scheduler.target.sizes)

    async def generate_images(self, request: ImageRequest) -> AsyncIterator[ImageEvent]:
        """One image request (n rows): partial images (if asked) and each image as it finishes."""
        self.requests += 1
        seed = request.seed if request.seed is not None else secrets.randbelow(2**63 - request.n)
        sampling = request.sampling.per_row()
        draft_per_step = draft_tokens_per_step(self.scheduler.config_for(request.method, request.cfg_scale, request.sampling.temperature))
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        watchers: list[Watcher[ImageResult]] = []
        for index in range(request.n):
            watcher = ImageWatcher(self.scheduler, loop, events, index, request.partial_images, draft_per_step)
            row_seed = (seed + index) % 2**63

            def submit(row_seed: int = row_seed) -> Ticket:
                return self.scheduler.submit(request.prompt, row_seed, method=request.method, cfg_scale=request.cfg_scale,
                                             sampling=sampling, negative_prompt=request.negative_prompt, size=request.size,
                                             coupling=request.coupling)

            self.loop.submit(submit, watcher)
            watchers.append(watcher)
        async for event in self._follow(events, watchers):
            yield event


class ChatReplica(ModelReplica[CaptionScheduler, CaptionResult]):
    """A vision-language model's replica."""

    task = "caption"

    def _open(self, served: ServedModel, dtype: torch.dtype, device: str | None) -> CaptionScheduler:
        return CaptionScheduler(served.model, served.decode, dtype=dtype, device=device, batch_size=served.batch_size, s3=served.s3)

    async def chat(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        """One chat: text deltas (when streamed) and the answer."""
        self.requests += 1
        seed = request.seed if request.seed is not None else secrets.randbelow(2**63)
        draft_per_step = draft_tokens_per_step(self.scheduler.config_for(request.method, None, request.sampling.temperature))
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        watcher = ChatWatcher(self.scheduler, loop, events, request.stream, request.stop, draft_per_step, self.served.stream_interval_s)
        messages, images = list(request.messages), list(request.images)
        limit, positions = self.limits.max_prompt_tokens, self.scheduler.max_positions
        # unset max_tokens: the model's decode config as caption_images resolves it (128 unless set), within the limit
        max_new_tokens = request.max_tokens or min(self.scheduler.base.max_new_tokens, self.limits.max_tokens)

        def submit() -> Ticket:
            tokens = self.scheduler.prompt_tokens(messages, images)
            if tokens > limit:
                raise ValueError(f"messages: the prompt is {tokens} tokens (images included), more than max_prompt_tokens={limit}")
            if positions is not None and tokens >= positions:
                raise ValueError(f"messages: the prompt is {tokens} tokens, the model has {positions} positions")
            watcher.prompt_tokens = tokens
            return self.scheduler.submit(messages, images, seed, method=request.method, sampling=request.sampling.per_row(),
                                         max_new_tokens=max_new_tokens, stop=request.stop, coupling=request.coupling)

        self.loop.submit(submit, watcher)
        async for event in self._follow(events, [watcher]):
            yield event


def follows_batch(served: ServedModel) -> bool:
    """Whether a replica of ``served`` plans every batch bucket and follows its live batch: ``follow_batch``
    set, a Jacobi method and its shape left to "auto" (draft-tree methods keep one plan: their proposer's
    per-row state, a draft model's cache, cannot be handed over mid-batch)."""
    return served.follow_batch and served.decode.method in JACOBI_METHODS and served.decode.auto_shape


REPLICAS: dict[str, type[ModelReplica[Any, Any]]] = {"t2i": ImageReplica, "caption": ChatReplica}


def replica_class(task: str) -> type[ModelReplica[Any, Any]]:
    """The deployment class of a served model's task."""
    return REPLICAS[task]
