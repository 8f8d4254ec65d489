"""A served model's engine where it runs (the engine process, ``engine_worker``): its plan, its
scheduler, the loop that drives it, and the requests it holds.

Requests arrive as ``Submit`` messages (an image request's ``n`` rows, or one chat); each row gets a
watcher whose events collect in an outbox, sent as one ``Emitted`` message per engine turn. Rows
leave here as raw pixels (images) and text (chat); PNG encoding and the HTTP framing are the
replica's.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Optional

import torch

from raydec.api.captions import CaptionResult
from raydec.api.images import ImageResult
from raydec.api.live_plan import bucket_sizes
from raydec.api.schedulers import CaptionScheduler, ImageScheduler, Ticket
from raydec.api.tuner import shape_label
from raydec.config import JACOBI_METHODS, DType
from raydec.runtime.planning import describe_plan, plan_replica, plan_replica_buckets
from raydec.serve.boundary import ChatDone, ChatRequest, Event, ImageDone, ImageRequest, ModelInfo, PartialImage, RawImage, RowStats, TextDelta
from raydec.serve.config import LimitsConfig, ServedModel
from raydec.serve.engine_core import CorePlacement
from raydec.serve.engine_loop import EngineLoop, Sink, Watcher
from raydec.serve.engine_messages import Emitted, FromEngine, Ready, Reply, RowTiming, Submit
from raydec.serve.metrics import draft_tokens_per_step

logger = logging.getLogger("raydec.serve")

TORCH_DTYPES: dict[DType, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16,
}


class ImageWatcher(Watcher[ImageResult]):
    """Sends up to ``partial_images`` partial images, at evenly spaced committed rows, then the image."""

    def __init__(self, scheduler: ImageScheduler, sink: Sink, index: int, partial_images: int, draft_per_step: int) -> None:
        super().__init__(sink, index, draft_per_step)
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
            self.emit(PartialImage(self.index, self.sent, RawImage.of(scheduler.partial_image(self.ticket))))
            self.sent += 1

    def finish(self, result: ImageResult) -> None:
        self.emit(ImageDone(self.index, RawImage.of(result.image), RowStats.of(result)), final=True)


class ChatWatcher(Watcher[CaptionResult]):
    """Sends the answer's new text after a step (held back while it may be the start of a stop
    string or of a multi-byte character), at most once per ``interval`` seconds (the first text at
    once), then the whole answer."""

    def __init__(self, scheduler: CaptionScheduler, sink: Sink, stream: bool, stop: tuple[str, ...], draft_per_step: int,
                 interval: float = 0.0) -> None:
        super().__init__(sink, 0, draft_per_step)
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
        self.emit(ChatDone(text, result.finish_reason, RowStats.of(result), self.prompt_tokens, result.num_tokens), final=True)


def follows_batch(served: ServedModel) -> bool:
    """Whether a replica of ``served`` plans every batch bucket and follows its live batch: ``follow_batch``
    set, a Jacobi method and its shape left to "auto" (draft-tree methods keep one plan: their proposer's
    per-row state, a draft model's cache, cannot be handed over mid-batch)."""
    return served.follow_batch and served.decode.method in JACOBI_METHODS and served.decode.auto_shape


class EngineHost:
    """One served model's scheduler and loop; ``send`` takes what goes back to the replica (on the engine
    thread, once per turn); ``on_death`` runs on the engine thread if its loop dies, after its rows' failures were sent."""

    def __init__(self, served: ServedModel, limits: LimitsConfig, send: Callable[[FromEngine], None],
                 on_death: Callable[[BaseException], None] | None = None) -> None:
        torch.set_num_threads(served.torch_threads)
        device = "cuda" if served.gpus_per_worker > 0 else None
        started = time.perf_counter()
        self.plan = plan_replica(served.processor_config())  # "auto" batch size and draft shape: from the shape cache, else measured now
        self.bucket_plans = plan_replica_buckets(served.processor_config(), self.plan, bucket_sizes(self.plan.batch_size)) \
            if follows_batch(served) and self.plan.batch_size > 1 else {}
        served = served.model_copy(update={"batch_size": self.plan.batch_size, "decode": self.plan.decode})
        self.served, self.limits, self.send, self.on_death = served, limits, send, on_death
        dtype = TORCH_DTYPES[served.dtype]
        self.scheduler: Any
        if served.task == "t2i":
            self.scheduler = ImageScheduler(served.model, served.decode, dtype=dtype, device=device, batch_size=served.batch_size,
                                            vqgan_path=served.vqgan_path, s3=served.s3)
        else:
            self.scheduler = CaptionScheduler(served.model, served.decode, dtype=dtype, device=device, batch_size=served.batch_size,
                                              s3=served.s3)
        self.scheduler.prefill_budget = served.prefill_budget_tokens
        self.scheduler.follow_plans(self.bucket_plans)  # the session of requests that name no method follows its live batch
        self.loop: EngineLoop[Any] = EngineLoop(self.scheduler, after_turn=self._flush, on_death=self._died)
        self.requests: dict[int, list[Watcher[Any]]] = {}  # request id -> its rows' watchers (until the replica lets go)
        self._outbox: list[tuple[int, Event, Optional[RowTiming]]] = []  # this turn's events (the engine thread's alone)
        # where the engine process runs its loop: set by its worker once the model is loaded (engine_core.pin)
        self.placement = CorePlacement((), note="not placed: built outside an engine process")
        self.summary = (f"model {served.name} ({served.task}, {served.model}) ready in {time.perf_counter() - started:.1f} s on "
                        f"{device or 'cpu'}: {describe_plan(self.plan)}")

    def ready(self) -> Ready:
        scheduler, task = self.scheduler, self.served.task
        size = sizes = None
        if task == "t2i":  # what "auto" makes, and the sizes it can make
            height, width = scheduler.target.image_size
            size, sizes = f"{width}x{height}", scheduler.target.sizes
        info = ModelInfo(task=task, method=scheduler.base.method, pid=os.getpid(), size=size, sizes=sizes)
        return Ready(info=info, plan=self.plan.record(), pid=os.getpid(), summary=f"{self.summary}; {self.placement.describe()}")

    def start(self) -> None:
        self.loop.start()

    # -- messages from the replica (the process's main thread) ----------------------------------------

    def submit(self, message: Submit) -> None:
        rid, request, seed = message.rid, message.request, message.seed

        def sink(event: Event, timing: Optional[RowTiming]) -> None:
            self._outbox.append((rid, event, timing))

        if isinstance(request, ImageRequest):
            self.requests[rid] = self._submit_images(request, seed, sink)
        else:
            self.requests[rid] = [self._submit_chat(request, seed, sink)]

    def cancel(self, rid: int) -> None:
        """The replica let go of request ``rid`` (it finished, or its client left): rows still running are cancelled."""
        for watcher in self.requests.pop(rid, ()):
            self.loop.cancel(watcher)

    def call(self, cid: int, name: str) -> None:
        """Run ``stats`` or ``decoding`` on the engine thread; the reply goes back under ``cid``."""
        if name not in ("stats", "decoding"):
            self.send(Reply(cid, None, f"no such call: {name!r}"))
            return

        def reply(value: Any, error: Optional[BaseException]) -> None:
            self.send(Reply(cid, value, None if error is None else f"{type(error).__name__}: {error}"))

        self.loop.call(getattr(self, name), reply)

    # -- on the engine thread ------------------------------------------------------------------------

    def _submit_images(self, request: ImageRequest, seed: int, sink: Sink) -> list[Watcher[Any]]:
        scheduler: ImageScheduler = self.scheduler
        sampling = request.sampling.per_row()
        draft_per_step = draft_tokens_per_step(scheduler.config_for(request.method, request.cfg_scale, request.sampling.temperature))
        watchers: list[Watcher[Any]] = []
        for index in range(request.n):
            watcher = ImageWatcher(scheduler, sink, index, request.partial_images, draft_per_step)
            row_seed = (seed + index) % 2**63

            def submit(row_seed: int = row_seed) -> Ticket:
                return scheduler.submit(request.prompt, row_seed, method=request.method, cfg_scale=request.cfg_scale,
                                        sampling=sampling, negative_prompt=request.negative_prompt, size=request.size,
                                        coupling=request.coupling)

            self.loop.submit(submit, watcher)
            watchers.append(watcher)
        return watchers

    def _submit_chat(self, request: ChatRequest, seed: int, sink: Sink) -> Watcher[Any]:
        scheduler: CaptionScheduler = self.scheduler
        draft_per_step = draft_tokens_per_step(scheduler.config_for(request.method, None, request.sampling.temperature))
        watcher = ChatWatcher(scheduler, sink, request.stream, request.stop, draft_per_step, self.served.stream_interval_s)
        messages, images = list(request.messages), list(request.images)
        limit, positions = self.limits.max_prompt_tokens, scheduler.max_positions
        # unset max_tokens: the model's decode config as caption_images resolves it (128 unless set), within the limit
        max_new_tokens = request.max_tokens or min(scheduler.base.max_new_tokens, self.limits.max_tokens)

        def submit() -> Ticket:
            tokens = scheduler.prompt_tokens(messages, images)
            if tokens > limit:
                raise ValueError(f"messages: the prompt is {tokens} tokens (images included), more than max_prompt_tokens={limit}")
            if positions is not None and tokens >= positions:
                raise ValueError(f"messages: the prompt is {tokens} tokens, the model has {positions} positions")
            watcher.prompt_tokens = tokens
            return scheduler.submit(messages, images, seed, method=request.method, sampling=request.sampling.per_row(),
                                    max_new_tokens=max_new_tokens, stop=request.stop, coupling=request.coupling)

        self.loop.submit(submit, watcher)
        return watcher

    def _flush(self) -> None:
        """Send this turn's events in one message, with the batch figures the replica's metrics export
        when a row finished in it."""
        if not self._outbox:
            return
        events, self._outbox = self._outbox, []
        finished = any(timing is not None for _, _, timing in events)
        live = self.scheduler.live
        scheduler = self.scheduler
        mean_batch = scheduler.rows_stepped / scheduler.decode_steps if finished and scheduler.decode_steps else None
        self.send(Emitted(events, mean_batch, dict(live.steps) if finished and live is not None else None))

    def _died(self, error: BaseException) -> None:
        self._flush()  # the rows' failures reach their requests
        if self.on_death is not None:
            self.on_death(error)

    def stats(self) -> dict[str, Any]:
        """The loop's figures, the decode plan, the engine process's CPU seconds so far (all its threads) and
        its cores and niceness (``CorePlacement.record``)."""
        return {**self.loop.stats(), **self.decoding(), "engine_cpu_s": time.process_time(), **self.placement.record()}

    def decoding(self) -> dict[str, Any]:
        """What requests that name no method decode with: the method, its draft shape and the batch size,
        and the plan they come from (``DecodePlan.record``: where each was taken from, the shape cache or
        measured at start, and the figures); ``live_plan``: for a replica that follows its live batch, the plan
        in use, decode steps per plan and the plan of each batch bucket (``LivePlans.record``), else None."""
        base, live = self.scheduler.base, self.scheduler.live
        return {"method": base.method, "shape": shape_label(base), "batch_size": self.scheduler.batch_size, "plan": self.plan.record(),
                "live_plan": live.record() if live is not None else None}
