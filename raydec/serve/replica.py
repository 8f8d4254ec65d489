"""A model replica: one target (and draft) on its device, one engine session in a background
loop, requests from the ingress streamed back as events.

Events (dicts) a request gets:
    {"kind": "partial", "index", "partial_image_index", "png"}       images, while rows commit
    {"kind": "image", "index", "png", "stats"}                        an image finished
    {"kind": "delta", "text"}                                         chat text as tokens commit
    {"kind": "done", "text", "finish_reason", "stats", "prompt_tokens"}  the chat answer
    {"kind": "error", "index", "status", "message", "code"}           the request failed
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from io import BytesIO
from typing import Any, AsyncIterator

from raydec.serve.config import LimitsConfig, ServedModel
from raydec.serve.engine_loop import EngineLoop, Watcher
from raydec.serve.metrics import ReplicaMetrics, draft_tokens_per_step

logger = logging.getLogger("raydec.serve")


def png_bytes(image: Any) -> bytes:
    buffer = BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def row_stats(result: Any) -> dict[str, Any]:
    """A finished row's decoding statistics, as ``usage`` reports them."""
    return {
        "target_forwards": result.target_forwards,
        "tokens": result.num_tokens,
        "tokens_per_forward": round(result.tokens_per_forward, 4),
        "accepted_lengths": list(result.accepted_lengths),
        "seed": result.seed,
        "decode_s": round(result.latency_s, 4),
    }


class ImageWatcher(Watcher):
    """Sends up to ``partial_images`` partial images, at evenly spaced committed rows, then the image."""

    def __init__(self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue, index: int, partial_images: int) -> None:
        super().__init__(loop, events, index)
        self.partial_images = partial_images
        self.sent = 0

    def progress(self, session: Any) -> None:
        if self.sent >= self.partial_images or self.ticket is None:
            return
        done, rows = session.rows_done(self.ticket), session.rows_per_image(self.ticket)
        if done >= rows:
            return  # the final image follows
        due = done * (self.partial_images + 1) // rows  # partial images due by now
        if due > self.sent:
            self.emit({"kind": "partial", "index": self.index, "partial_image_index": self.sent,
                       "png": png_bytes(session.partial_image(self.ticket))})
            self.sent += 1

    def finish(self, session: Any, result: Any) -> None:
        self.emit({"kind": "image", "index": self.index, "png": png_bytes(result.image), "stats": row_stats(result)})


class ChatWatcher(Watcher):
    """Sends the answer's new text after each step (held back while it may be the start of a
    stop string or of a multi-byte character), then the whole answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue, stream: bool, stop: tuple[str, ...]) -> None:
        super().__init__(loop, events, 0)
        self.stream = stream
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.sent = ""
        self.prompt_tokens = 0

    def progress(self, session: Any) -> None:
        if self.ticket is None or not session.tokens(self.ticket):
            return
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if not self.stream:
            return
        text = session.text(self.ticket)
        ready = text[: len(text) - self.hold] if self.hold else text
        ready = ready.rstrip("\ufffd")  # an incomplete character
        if ready.startswith(self.sent) and len(ready) > len(self.sent):
            self.emit({"kind": "delta", "text": ready[len(self.sent):]})
            self.sent = ready

    def finish(self, session: Any, result: Any) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        text = result.caption
        if self.stream and text.startswith(self.sent) and len(text) > len(self.sent):
            self.emit({"kind": "delta", "text": text[len(self.sent):]})
        self.emit({"kind": "done", "text": text, "finish_reason": result.finish_reason, "stats": row_stats(result),
                   "prompt_tokens": self.prompt_tokens, "completion_tokens": result.num_tokens})


class ModelReplica:
    """The Serve deployment of one served model (see ``app.build_app`` for its options)."""

    def __init__(self, served: ServedModel, limits: LimitsConfig) -> None:
        import torch

        from raydec.api.sessions import CaptionSession, ImageSession

        logging.getLogger("raydec").setLevel(logging.INFO)
        torch.set_num_threads(served.torch_threads)
        self.served, self.limits = served, limits
        device = "cuda" if served.num_gpus > 0 else None
        dtype = getattr(torch, served.dtype)
        started = time.perf_counter()
        if served.task == "t2i":
            self.session = ImageSession(served.model, served.decode, dtype=dtype, device=device, max_batch=served.max_batch_size)
        else:
            self.session = CaptionSession(served.model, served.decode, dtype=dtype, device=device, max_batch=served.max_batch_size)
        self.metrics = ReplicaMetrics(served.name)
        self.loop = EngineLoop(self.session, on_finish=self._finished)
        self.loop.start()
        self.requests = 0
        logger.info("model %s (%s, %s) ready in %.1f s on %s", served.name, served.task, served.model,
                    time.perf_counter() - started, device or "cpu")

    def _finished(self, watcher: Any, result: Any) -> None:
        self.metrics.finished(watcher, result, getattr(watcher, "draft_per_step", 0))
        stats = self.loop.stats()
        self.metrics.record_batch(stats["mean_batch_size"])

    # -- what the ingress calls ------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """What the API needs to know of the model."""
        target = self.session.target
        info: dict[str, Any] = {"task": self.served.task, "method": self.session.base.method, "pid": os.getpid()}
        if self.served.task == "t2i":
            height, width = target.image_size
            info["size"] = f"{width}x{height}"  # its own: what "auto" or no size gives
            info["sizes"] = target.sizes
        return info

    def stats(self) -> dict[str, Any]:
        return {**self.loop.stats(), **self.metrics.snapshot(), "requests": self.requests, "pid": os.getpid()}

    def check_health(self) -> None:
        """Serve's health check: fails once the engine loop has died (Serve then replaces the replica)."""
        if not self.loop.alive:
            raise RuntimeError(f"the engine loop of model {self.served.name!r} died: {self.loop.died!r}")

    async def generate_images(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """One image request (n rows): partial images (if asked) and each image as it finishes."""
        self.requests += 1
        n = request["n"]
        seed = request["seed"] if request.get("seed") is not None else secrets.randbelow(2**63 - n)
        sampling = {k: request[k] for k in ("temperature", "top_k", "top_p") if request.get(k) is not None}
        method, cfg_scale = request.get("method"), request.get("cfg_scale")
        draft_per_step = draft_tokens_per_step(self.session.config_for(method, cfg_scale, request.get("temperature")))
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        watchers = []
        for index in range(n):
            watcher = ImageWatcher(loop, events, index, request.get("partial_images", 0) if request.get("stream") else 0)
            watcher.draft_per_step = draft_per_step
            row_seed = (seed + index) % 2**63

            def submit(row_seed: int = row_seed) -> Any:
                return self.session.submit(request["prompt"], row_seed, method=method, cfg_scale=cfg_scale,
                                           sampling=sampling or None, negative_prompt=request.get("negative_prompt"),
                                           size=request.get("size"))

            self.loop.submit(submit, watcher)
            watchers.append(watcher)
        async for event in self._follow(events, watchers, n):
            yield event

    async def chat(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """One chat: text deltas (when streamed) and the answer."""
        self.requests += 1
        seed = request["seed"] if request.get("seed") is not None else secrets.randbelow(2**63)
        sampling = {k: request[k] for k in ("temperature", "top_k", "top_p") if request.get(k) is not None}
        method = request.get("method")
        stop = tuple(request.get("stop") or ())
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        watcher = ChatWatcher(loop, events, bool(request.get("stream")), stop)
        watcher.draft_per_step = draft_tokens_per_step(self.session.config_for(method, None, request.get("temperature")))
        messages, images = request["messages"], request["images"]
        limit, positions = self.limits.max_prompt_tokens, self.session.max_positions
        # unset max_tokens: the model's decode config as caption_images resolves it (128 unless set), within the limit
        default_tokens = min(self.session.base.max_new_tokens, self.limits.max_tokens)

        def submit() -> Any:
            tokens = self.session.prompt_tokens(messages, images)
            if tokens > limit:
                raise ValueError(f"messages: the prompt is {tokens} tokens (images included), more than max_prompt_tokens={limit}")
            if positions is not None and tokens >= positions:
                raise ValueError(f"messages: the prompt is {tokens} tokens, the model has {positions} positions")
            watcher.prompt_tokens = tokens
            return self.session.submit(messages, images, seed, method=method, sampling=sampling or None,
                                       max_new_tokens=request["max_tokens"] or default_tokens, stop=stop)

        self.loop.submit(submit, watcher)
        async for event in self._follow(events, [watcher], 1):
            yield event

    async def _follow(self, events: asyncio.Queue, watchers: list[Watcher], rows: int) -> AsyncIterator[dict[str, Any]]:
        """The request's events until each row has finished or one failed; rows still running
        when the caller goes away (a client disconnect cancels this generator) are cancelled."""
        finished = 0
        try:
            while finished < rows:
                event = await events.get()
                yield event
                if event["kind"] == "error":
                    return
                if event["kind"] in ("image", "done"):
                    finished += 1
        finally:
            for watcher in watchers:
                self.loop.cancel(watcher)
