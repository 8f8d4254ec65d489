"""Schedulers: requests that arrive over time, decoded together (what a Serve replica drives).

    images = ImageScheduler("reference", DecodeConfig(method="sjd_pac"), batch_size=8)
    ticket = images.submit("a red circle on the left", seed=7)
    while images.busy:
        for done in images.step():          # one admission or one decode step
            result = images.result(done)    # an ImageResult, as generate_images gives it

A request joins the running batch between steps (continuous batching) and can be cancelled.
Rows of one engine share its method and classifier-free guidance, so a scheduler keeps one engine
and its DecodeSession per (method, cfg_scale, draft tree) that requests ask for and steps each in turn; temperature,
top-k and top-p are per row. ``follow_plans`` makes the session of the base config (at the model's own size) follow
its live batch: a plan per batch bucket, switched with hysteresis (``raydec.api.live_plan``); requests that name
another method, CFG scale or size keep their own sessions, which decode with their config. A row's output depends only on its inputs, seed and config, so it equals
``generate_images`` / ``caption_images`` for the same seed (exactly so in float32 and float64).
"""

from __future__ import annotations

import collections
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from PIL import Image

from raydec.api.captions import caption_result, caption_text
from raydec.api.images import decode_image, image_result
from raydec.api.inputs import as_decode_config, caption_decode_config, check_positions, image_decode_config, max_positions, over_checkpoint
from raydec.api.live_plan import DEFAULT_PATIENCE, LivePlans
from raydec.api.plan import DecodePlan
from raydec.config import DRAFT_METHODS, IMAGE_METHODS, CAPTION_METHODS, DecodeConfig, SamplingConfig, parse_image_size
from raydec.io.config import S3Config
from raydec.models.image_gen import ImagePrompt
from raydec.models.loading import draft_dtype, load_draft_model, load_target
from raydec.speculative.engine import DecodeSession, Engine
from raydec.speculative.proposers.factory import make_proposer
from raydec.speculative.requests import COUPLINGS, Coupling, RowRequest, RowState

#: decode-step intervals a scheduler keeps (``row_step_times``: the most recent)
ROW_STEP_TIMES = 1024

# what a request may set per row (CFG is the engine's: a separate key)
ROW_SAMPLING = ("temperature", "top_k", "top_p", "repetition_penalty")


def check_coupling(coupling: str | None) -> Coupling | None:
    """A request's coupling, or a ValueError naming the field and value."""
    if coupling is not None and coupling not in COUPLINGS:
        raise ValueError(f"coupling={coupling!r} is not one of {', '.join(COUPLINGS)}")
    return coupling


@dataclass(frozen=True)
class Ticket:
    """A submitted request: which of the scheduler's sessions decodes it and its handle there."""

    session_key: tuple  # (method, cfg_scale, draft tree, target variant): rows of one session share these
    handle: int


class Scheduler(ABC):
    """One DecodeSession per (method, cfg_scale, draft tree), stepped in turn; a task's subclass
    says how its engine is built (``make_engine``)."""

    target: Any  # the loaded target (the subclass loads it)

    def __init__(self, base: DecodeConfig, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.base = base
        self.batch_size = batch_size
        self.sessions: dict[tuple, DecodeSession] = {}
        self._turn = 0
        self.rows_stepped = 0  # rows in the batch, summed over decode steps (mean batch = this / decode_steps)
        self.decode_steps = 0
        self.live: LivePlans | None = None  # the base config's session follows it (``follow_plans``)
        self.prefill_budget: int | None = None  # prompt tokens one admission prefills at most (DecodeSession.prefill_budget)
        # what a decoding row waits from one of its decode steps to the next (the step, and any admission or other
        # session's step between them): the last ROW_STEP_TIMES, for percentiles under load
        self.row_step_times: collections.deque[float] = collections.deque(maxlen=ROW_STEP_TIMES)
        self._last_decode: dict[tuple, float] = {}  # session key -> perf_counter at its last decode step's end, while rows decode

    def config_for(self, method: str | None, cfg_scale: float | None, temperature: float | None = None) -> DecodeConfig:
        """The engine config for a request: the base with its method and CFG scale. A draft
        model's default tree depends on whether rows sample (``DraftTreeConfig.for_temperature``),
        so a request whose temperature is on the other side of 0 gets the engine with that tree,
        as ``caption_images`` with its temperature would."""
        update: dict[str, Any] = {}
        sampling = self.base.sampling
        if method is not None:
            update["method"] = method
        if cfg_scale is not None and cfg_scale != sampling.cfg_scale:
            sampling = sampling.model_copy(update={"cfg_scale": float(cfg_scale)})
        if temperature is not None and self.base.draft_tree is None and (temperature == 0) != sampling.greedy:
            sampling = sampling.model_copy(update={"temperature": float(temperature)})
        if sampling is not self.base.sampling:
            update["sampling"] = sampling
        return self.base.model_copy(update=update) if update else self.base

    def session(self, config: DecodeConfig, variant: Any = None) -> tuple[tuple, DecodeSession]:
        """The engine session for ``config`` (and a task's target ``variant``: an image size)."""
        key = self.session_key(config, variant)
        if key not in self.sessions:
            self.sessions[key] = self.make_engine(config, variant).session(batch_size=self.batch_size)
            self.sessions[key].prefill_budget = self.prefill_budget
            if self.live is not None and key == self.session_key(self.base):
                self.sessions[key].follow(self.live)
        return key, self.sessions[key]

    @staticmethod
    def session_key(config: DecodeConfig, variant: Any = None) -> tuple:
        """The session rows under ``config`` (at ``variant``) share."""
        tree = config.tree
        return (config.method, config.sampling.cfg_scale,
                (tree.depth, tree.top_k, tree.total_tokens) if config.method in DRAFT_METHODS else None, variant)

    def follow_plans(self, plans: Mapping[int, DecodePlan | DecodeConfig] | None, patience: int = DEFAULT_PATIENCE) -> None:
        """Decode the base config's session with the plan of its live batch: ``plans`` per batch bucket
        (``raydec.api.live_plan.LivePlans``: methods ar and the Jacobi ones; each plan's proposer built
        here over the target), switched after ``patience`` steps of a changed bucket. None: stop following."""
        self.live = LivePlans(plans, patience, make=lambda config: make_proposer(config, self.target)) if plans else None
        own = self.sessions.get(self.session_key(self.base))
        if own is not None:
            own.follow(self.live)

    @abstractmethod
    def make_engine(self, config: DecodeConfig, variant: Any = None) -> Engine:
        """The engine (target, proposer, stop tokens) that decodes rows under ``config``."""

    @property
    def busy(self) -> bool:
        return any(session.busy for session in self.sessions.values())

    def step(self) -> list[Ticket]:
        """One step of the next busy engine (its admission or one decode step); returns the
        requests that finished in it."""
        busy = [key for key, session in self.sessions.items() if session.busy]
        if not busy:
            return []
        key = busy[self._turn % len(busy)]
        self._turn += 1
        session = self.sessions[key]
        decoding = len(session.active)
        steps_before = session.steps
        finished = session.step()
        if session.steps > steps_before:
            self.decode_steps += 1
            self.rows_stepped += decoding
            now = time.perf_counter()
            last = self._last_decode.pop(key, None)
            if last is not None:
                self.row_step_times.append(now - last)
            if session.active:
                self._last_decode[key] = now
        elif not session.active:
            self._last_decode.pop(key, None)  # no row decodes: the wait for the next one is not a row's step
        return [Ticket(key, handle) for handle in finished]

    def row(self, ticket: Ticket) -> RowState:
        return self.sessions[ticket.session_key].rows[ticket.handle]

    def tokens(self, ticket: Ticket) -> list[int]:
        """The tokens committed so far (read-only)."""
        return self.row(ticket).generated

    def finish_reason(self, ticket: Ticket) -> str:
        """Why a finished request ended (eos, length, cancelled, ...; empty while it runs)."""
        return self.row(ticket).stats.finish_reason

    def cancel(self, ticket: Ticket) -> None:
        """Stop a request; it finishes (reason "cancelled") at the next step."""
        session = self.sessions.get(ticket.session_key)
        if session is not None and ticket.handle in session.rows:
            session.cancel(ticket.handle)

    def release(self, ticket: Ticket) -> None:
        """Forget a finished request (call after reading its result)."""
        self.sessions[ticket.session_key].release(ticket.handle)

    def active_rows(self) -> int:
        return sum(len(session.active) for session in self.sessions.values())

    def queued_rows(self) -> int:
        return sum(len(session.queue) for session in self.sessions.values())

    def drop(self) -> list[Ticket]:
        """Abandon every engine (after a step failed, their state is unknown); returns the
        requests that were queued or decoding."""
        lost = [Ticket(key, handle) for key, session in self.sessions.items() for handle, row in session.rows.items() if not row.done]
        self.sessions.clear()
        return lost

    def row_sampling(self, config: DecodeConfig, sampling: dict[str, Any] | None) -> SamplingConfig | None:
        """A row's own sampling: the fields it sets over the engine's (None: the engine's)."""
        if not sampling:
            return None
        unknown = set(sampling) - set(ROW_SAMPLING)
        if unknown:
            raise ValueError(f"sampling: {sorted(unknown)} cannot be set per request (per request: {', '.join(ROW_SAMPLING)})")
        return over_checkpoint(SamplingConfig(**sampling), config.sampling)


class ImageScheduler(Scheduler):
    """Text-to-image requests (methods ar, sjd, sjd_ac, sjd_pac) decoded as they arrive."""

    def __init__(
        self, model: str | Path | Any = "reference", decode: DecodeConfig | dict | None = None,
        dtype: torch.dtype = torch.float32, device: str | None = None, batch_size: int = 8, vqgan_path: str | Path | None = None,
        s3: S3Config | None = None,
    ) -> None:
        self.target = load_target(model, task="t2i", dtype=dtype, device=device, vqgan_path=vqgan_path, s3=s3)
        config = image_decode_config(as_decode_config(decode), self.target)
        if config.method not in IMAGE_METHODS:
            raise ValueError(f"decode.method={config.method!r} is not a text-to-image method (use {', '.join(IMAGE_METHODS)})")
        super().__init__(config, batch_size)

    def make_engine(self, config: DecodeConfig, variant: Any = None) -> Engine:
        target = self.target_of_size(variant)
        config = config.model_copy(update={"max_new_tokens": target.num_image_tokens})
        return Engine(target, make_proposer(config, target), config.sampling, config.max_new_tokens, compaction=config.compaction, compile=config.compile, coupling=config.coupling, constraint=target.vocab_constraint(),
                      eos_token_ids=target.eos_token_ids)

    def target_of_size(self, size: tuple[int, int] | None) -> Any:
        """The target making ``size`` (width, height) images; None: the model's own size."""
        return self.target if size is None else self.target.with_size(*size)

    def target_of(self, ticket: Ticket) -> Any:
        """The target (at its size) that decodes ``ticket``."""
        return self.target_of_size(ticket.session_key[-1])

    def rows_per_image(self, ticket: Ticket) -> int:
        """Image-token rows of ``ticket``'s image."""
        return int(self.target_of(ticket).layout_grid[0])

    def submit(
        self, prompt: str, seed: int, method: str | None = None, cfg_scale: float | None = None,
        sampling: dict[str, Any] | None = None, negative_prompt: str | None = None, size: str | None = None,
        coupling: Coupling | None = None,
    ) -> Ticket:
        """Queue one image. method / cfg_scale: the engine's unless set; sampling: per-row
        temperature, top_k, top_p over the config's; size: ``"WIDTHxHEIGHT"`` (None, "auto":
        the model's own), a ValueError naming the sizes the model makes when it cannot;
        coupling: "rejection" or "gumbel" (None: the config's)."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
        if method is not None and method not in IMAGE_METHODS:
            raise ValueError(f"method={method!r} is not a text-to-image method (use {', '.join(IMAGE_METHODS)})")
        dims = parse_image_size(size)
        target = self.target_of_size(dims)  # raises for a size the model cannot make
        dims = None if target is self.target else dims
        config = self.config_for(method, cfg_scale, (sampling or {}).get("temperature"))
        request = RowRequest(ImagePrompt(prompt, negative_prompt), seed=int(seed), max_new_tokens=target.num_image_tokens,
                             sampling=self.row_sampling(config, sampling), coupling=check_coupling(coupling))
        check_positions(target, [request], 2 if config.sampling.uses_cfg else 1)
        key, session = self.session(config, dims)
        return Ticket(key, session.submit(request))

    def rows_done(self, ticket: Ticket) -> int:
        """Image rows whose tokens are all committed."""
        columns = self.target_of(ticket).layout_grid[1]
        return len(self.tokens(ticket)) // columns

    def partial_image(self, ticket: Ticket) -> Image.Image:
        """The image as decoded so far: the committed rows, the rest grey. Rows not yet drafted
        are filled by repeating the last committed row before VQ decoding (their pixels are then
        greyed), so layout tokens stay in place."""
        target = self.target_of(ticket)
        tokens = list(self.tokens(ticket))
        rows, columns = target.layout_grid
        done = len(tokens) // columns
        if done == 0:
            raise ValueError("partial_image: no image row is committed yet")
        tokens = tokens[: done * columns]
        while len(tokens) < target.num_image_tokens:
            tokens.append(tokens[len(tokens) - columns])
        image = target.decode_tokens(torch.tensor([tokens], dtype=torch.long))[0]
        cut = image.height * done // rows
        if cut < image.height:
            grey = Image.new("RGB", (image.width, image.height - cut), (128, 128, 128))
            image.paste(grey, (0, cut))
        return image

    def result(self, ticket: Ticket):
        """A finished request's ImageResult (VQ-decoded here)."""
        session = self.sessions[ticket.session_key]
        row = session.rows[ticket.handle]
        output = session.output(ticket.handle)
        if row.stats.finish_reason == "cancelled":
            raise ValueError("result: the request was cancelled")
        return image_result(row.request, output, decode_image(self.target_of(ticket), output.tokens), ticket.session_key[0])


class CaptionScheduler(Scheduler):
    """Vision-language requests (methods ar, vispec, eagle) decoded as they arrive, with stop
    strings."""

    def __init__(
        self, model: str | Path | Any = "reference", decode: DecodeConfig | dict | None = None,
        dtype: torch.dtype = torch.float32, device: str | None = None, batch_size: int = 8, s3: S3Config | None = None,
    ) -> None:
        self.model, self.s3 = model, s3
        self.target = load_target(model, task="caption", dtype=dtype, device=device, s3=s3)
        super().__init__(caption_decode_config(as_decode_config(decode), self.target), batch_size)
        self.max_positions = max_positions(self.target)
        self.stops: dict[Ticket, tuple[str, ...]] = {}
        self.stopped: dict[Ticket, str] = {}  # the text up to a stop string, for requests it ended
        self._decoded: dict[Ticket, tuple[int, str]] = {}  # (tokens, text): detokenized once per step, not per reader

    def make_engine(self, config: DecodeConfig, variant: Any = None) -> Engine:
        target = self.target
        draft_model = None
        if config.method in DRAFT_METHODS:
            draft_model = load_draft_model(target, config.method, self.model, config.draft_model, dtype=draft_dtype(target, config.draft_dtype),
                                           s3=self.s3)
        return Engine(target, make_proposer(config, target, draft_model), config.sampling, config.max_new_tokens, compaction=config.compaction, compile=config.compile, coupling=config.coupling, eos_token_ids=target.eos_token_ids,
                      max_positions=self.max_positions)

    def submit(
        self, messages: list[dict[str, Any]], images: Sequence[Image.Image], seed: int, method: str | None = None,
        sampling: dict[str, Any] | None = None, max_new_tokens: int | None = None, stop: Sequence[str] = (),
        coupling: Coupling | None = None,
    ) -> Ticket:
        """Queue one chat: Hugging Face messages whose ``{"type": "image"}`` parts take
        ``images`` in order. stop: strings that end the answer (not included in it); coupling:
        "rejection" or "gumbel" (None: the config's)."""
        from raydec.models.hf_vlm import VlmPrompt  # lazy: VLM model code (transformers, ~2 s) loads only for captioning

        if method is not None and method not in CAPTION_METHODS:
            raise ValueError(f"method={method!r} is not a captioning method (use {', '.join(CAPTION_METHODS)})")
        config = self.config_for(method, None, (sampling or {}).get("temperature"))
        text = self.target.format_messages(messages)
        request = RowRequest(VlmPrompt(text, list(images)), seed=int(seed),
                             max_new_tokens=max_new_tokens or config.max_new_tokens, sampling=self.row_sampling(config, sampling),
                             coupling=check_coupling(coupling))
        key, session = self.session(config)
        ticket = Ticket(key, session.submit(request))
        if stop:
            self.stops[ticket] = tuple(s for s in stop if s)
        return ticket

    def prompt_tokens(self, messages: list[dict[str, Any]], images: Sequence[Image.Image]) -> int:
        """The prompt's length in tokens, image tokens included (as the model will see it)."""
        from raydec.models.hf_vlm import VlmPrompt  # lazy: VLM model code (transformers, ~2 s) loads only for captioning

        inputs = self.target.processor_inputs(VlmPrompt(self.target.format_messages(messages), list(images)))
        return int(inputs["input_ids"].shape[-1])

    def text(self, ticket: Ticket) -> str:
        """The answer so far (up to its stop string, once one has ended it)."""
        if ticket in self.stopped:
            return self.stopped[ticket]
        return self._text_now(ticket)

    def _text_now(self, ticket: Ticket) -> str:
        tokens = self.tokens(ticket)
        cached = self._decoded.get(ticket)
        if cached is None or cached[0] != len(tokens):
            cached = (len(tokens), caption_text(self.target, tokens))
            self._decoded[ticket] = cached
        return cached[1]

    def step(self) -> list[Ticket]:
        finished = super().step()
        for ticket, stops in list(self.stops.items()):  # a stop string ends its row at this step
            if ticket in self.stopped or self.row(ticket).done:
                continue
            text = self._text_now(ticket)
            cut = min((text.find(s) for s in stops if s in text), default=-1)
            if cut >= 0:
                self.stopped[ticket] = text[:cut]
                self.cancel(ticket)
        return finished

    def finish_reason(self, ticket: Ticket) -> str:
        """As for any request, but "stop" for one a stop string ended (its row was cancelled)."""
        return "stop" if ticket in self.stopped else super().finish_reason(ticket)

    def result(self, ticket: Ticket):
        """A finished request's CaptionResult (finish_reason eos, length or stop)."""
        session = self.sessions[ticket.session_key]
        row = session.rows[ticket.handle]
        output = session.output(ticket.handle)
        if ticket in self.stopped:
            return caption_result(row.request, output, self.stopped[ticket], ticket.session_key[0], finish_reason="stop")
        if row.stats.finish_reason == "cancelled":
            raise ValueError("result: the request was cancelled")
        return caption_result(row.request, output, caption_text(self.target, output.tokens), ticket.session_key[0])

    def release(self, ticket: Ticket) -> None:
        super().release(ticket)
        self.stops.pop(ticket, None)
        self.stopped.pop(ticket, None)
        self._decoded.pop(ticket, None)
