"""Rows joining a session: their prompts' prefill, in one forward or in chunks over several steps.

An admission left-pads the joining rows' prompts into one window ``[M, L]`` (model rows: with
classifier-free guidance each request's conditional row, then its unconditional one) and runs the
target over it into a cache of its own. Under a prefill budget a window wider than the budget runs
in chunks of positions, one per session step, each attending to the chunks before it through that
cache, so the rows already decoding wait out one chunk per step instead of the whole prompt:

    chunk k: queries L[a:b], keys L[0:b]   (mask[:, :, a:b, :b] of the window's causal mask)

The hidden states of every chunk are kept for draft models, the logits of the last position for the
first token. A chunked prefill computes what the one forward computes, position by position.

``AdmitsRows`` is the admission half of ``DecodeSession`` (``raydec.speculative.engine``): which queued
rows join, their prefill, and their joining the batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from raydec.speculative.cache import RaggedCache
from raydec.speculative.prefill import first_tokens, left_pad, pad_layer_residuals, prefill_mask
from raydec.speculative.proposers.base import DecodeState, Prefill
from raydec.speculative.random import RowRandom
from raydec.speculative.requests import RowState
from raydec.speculative.sampling import process_logits
from raydec.speculative.target import DecodingTarget, ForwardOutput, PromptInputs, stack_prompts

if TYPE_CHECKING:
    from raydec.speculative.refill import RefillPolicy

logger = logging.getLogger("raydec.speculative.engine")


@dataclass
class Admission:
    """Rows whose prefill is under way."""

    handles: list[int]
    rows: list[RowState]
    joining: RaggedCache  # the rows' own cache, until it joins the batch's
    embeds: torch.Tensor  # [M, L, H]
    positions: torch.Tensor  # [M, L] or [P, M, L]
    valid: torch.Tensor  # [M, L] bool, False on left padding
    next_position: torch.Tensor  # [M]
    image_index: torch.Tensor  # [M, L]
    mask: torch.Tensor  # [M, 1, L, L] additive
    residuals: torch.Tensor | None  # [K, M, L, H]
    room: int  # cache slots the rows take at most
    done: int = 0  # window positions prefilled so far
    hidden: list[torch.Tensor] = field(default_factory=list)  # [M, chunk, H] per chunk, when the proposer wants them
    logits: torch.Tensor | None = None  # [M, 1, V]: the last position's, once the last chunk ran

    @property
    def width(self) -> int:
        return int(self.embeds.shape[1])

    @property
    def finished(self) -> bool:
        return self.done >= self.width

    def output(self) -> ForwardOutput:
        """The prefill as one forward would give it: the last position's logits, every position's hidden states."""
        assert self.logits is not None, "the prefill has chunks left"
        hidden = torch.cat(self.hidden, dim=1) if self.hidden else None
        return ForwardOutput(self.logits, hidden)


def chunk_width(budget: int | None, model_rows: int, width: int) -> int:
    """Window positions one chunk covers: the whole window without a budget, else as many as keep the chunk's
    model-row tokens within ``budget`` (at least one)."""
    if budget is None:
        return width
    return max(1, min(width, budget // model_rows))


def prefill_chunk(admission: Admission, target: DecodingTarget, budget: int | None, want_hidden: bool) -> bool:
    """Run the admission's next chunk (the rest of the window without a budget); whether the prefill is complete."""
    start = admission.done
    end = min(admission.width, start + chunk_width(budget, admission.embeds.shape[0], admission.width))
    whole = start == 0 and end == admission.width  # one forward: the tensors as they are
    embeds = admission.embeds if whole else admission.embeds[:, start:end]
    positions = admission.positions if whole else admission.positions[..., start:end]
    mask = admission.mask if whole else admission.mask[:, :, start:end, :end]
    extra = {}
    if admission.residuals is not None:  # only targets that make them take them
        extra["layer_residuals"] = admission.residuals if whole else admission.residuals[:, :, start:end]
    output = target.forward(embeds, None, positions, mask, admission.joining.kv, want_hidden=want_hidden, logits_to_keep=1, **extra)
    if want_hidden and output.hidden is not None:
        admission.hidden.append(output.hidden)
    admission.done = end
    if admission.finished:
        admission.logits = output.logits
        admission.joining.start(admission.valid, admission.next_position)
    return admission.finished


class AdmitsRows:
    """The admission half of a ``DecodeSession``: the session's state (rows, queue, active rows, cache,
    engine, refill policy, prefill budget) is its own; these methods read and update it."""

    engine: Any
    rows: dict[int, RowState]
    queue: list[int]
    active: list[int]
    refill: "RefillPolicy"
    prefill_budget: int | None
    _prompts: dict[int, PromptInputs]
    _admission: Admission | None
    _admission_running: bool
    _admission_seconds: float

    def _prefill_step(self, admission: Admission, start: float) -> float:
        """The admission's next chunk (all of it without a budget); once its prefill is complete the rows join the
        batch and the refill policy records the admission. Returns the seconds this step took."""
        engine = self.engine
        if prefill_chunk(admission, engine.target, self.prefill_budget, engine.proposer.wants_hidden):
            self._admission = None
            self._join(admission)
            seconds = time.perf_counter() - start
            self.refill.admitted(self._admission_seconds + seconds, len(admission.handles), while_decoding=self._admission_running)
            return seconds
        return time.perf_counter() - start

    def _joining(self, room: int) -> list[int]:
        """The queued rows the next admission takes: the first ``room``, fewer when their prefill window (model rows
        times its width, the longest prompt) would pass ``prefill_budget``; the first always joins, however long (its
        prefill then runs in chunks)."""
        candidates = self.queue[:room]
        if self.prefill_budget is None:
            return candidates
        for handle in [h for h in self._prompts if h not in self.rows or self.rows[h].done]:  # cancelled while queued
            del self._prompts[handle]
        joining, width = [], 0
        for handle in candidates:
            if handle not in self._prompts:
                self._prompts[handle] = self.engine.target.prompt_inputs(self.rows[handle].request.prompt)
            wider = max(width, self._prompts[handle].length)
            if joining and wider * (len(joining) + 1) * self.engine.streams > self.prefill_budget:
                break  # the left-padded window (model rows x its width) would pass the budget
            joining.append(handle)
            width = wider
        return joining

    def _begin_admission(self, handles: list[int]) -> Admission:
        """The rows' prompts left-padded into one prefill window, and the cache it fills (model rows in request
        order; with CFG each request's conditional row, then its unconditional one)."""
        engine, target = self.engine, self.engine.target
        now = time.perf_counter()
        rows = [self.rows[h] for h in handles]
        prompts = [self._prompts.pop(h, None) or target.prompt_inputs(row.request.prompt) for h, row in zip(handles, rows)]
        for handle, row, prompt in zip(handles, rows, prompts):
            row.admitted_at = now
            row.context_ids = prompt.token_ids
            self._fit_positions(handle, row, prompt)
        if engine.streams == 2:  # each request's pair of model rows side by side
            unconditional = [target.prompt_inputs(row.request.prompt, unconditional=True) for row in rows]
            prompts = [prompt for pair in zip(prompts, unconditional) for prompt in pair]
        prompts = stack_prompts(prompts)
        joining = RaggedCache(len(prompts), compaction=engine.compaction, device=target.device, layout=engine.cache_layout)
        embeds, positions, valid, next_position, image_index = left_pad(prompts, target)
        # room for the prompts and the rows' whole decode (their caps, the holes compaction leaves, a
        # window) before a buffer grows: allocated by the prefill's own writes
        room = embeds.shape[1] + max(row.limit for row in rows) * 5 // 4 + 128
        joining.reserve(room)
        if not self.active and self.batch_size:  # the batch's cache: room for its rows, so rows join and leave in place
            joining.reserve_rows(self.batch_size * engine.streams)
        mask = joining.attention_mask(prefill_mask(valid), target.dtype)
        return Admission(list(handles), rows, joining, embeds, positions, valid, next_position, image_index, mask,
                         pad_layer_residuals(prompts, valid, target), room)

    def _join(self, admission: Admission) -> None:
        """After the prefill: P_0 gives each row its first token; the rows' cache becomes the batch's, or joins it
        behind the active rows."""
        engine, target = self.engine, self.engine.target
        handles, rows, joining = admission.handles, admission.rows, admission.joining
        output = admission.output()
        batch = len(handles)
        first_probs = process_logits(
            output.logits[:, -1:], self._sampling_of(list(handles), output.logits.device), batch, engine.constraint,
            torch.zeros(batch, 1, dtype=torch.long, device=output.logits.device), self._context(handles, output.logits.shape[-1]),
        )[:, 0]  # [B, V]
        coupled = [self._coupling(row) == "gumbel" for row in rows]
        random = RowRandom.for_seeds([row.request.seed for row in rows], first_probs.device, coupled)
        first = first_tokens(first_probs, random, coupled).tolist()  # the prefill's read-back
        random = random.advanced()
        for row, token in zip(rows, first):
            row.generated.append(int(token))
            row.stats.target_forwards = 1

        state = DecodeState(list(handles), [row.generated for row in rows], random, target.vocab_size, engine.constraint, first_probs.dtype)
        prefill = Prefill(output, admission.embeds, admission.valid, admission.image_index, admission.room)
        if not self.active:  # an empty batch starts afresh
            engine.proposer.start(state, first_probs, prefill)
            self.cache, self.random, self.prob_dtype = joining, random, first_probs.dtype
        else:
            engine.proposer.admit(state, first_probs, prefill)
            self.cache.append_rows(joining)
            self.random = self.random.cat(random)
        self.active = self.active + list(handles)

    def _fit_positions(self, handle: int, row: RowState, prompt: PromptInputs) -> None:
        """Cap a row's new tokens where the model's positions end (a prompt that fills them is an error)."""
        max_positions = self.engine.max_positions
        if max_positions is None:
            return
        start = prompt.next_position if prompt.next_position is not None else prompt.length  # M-RoPE: fewer than tokens
        room = max_positions - start
        if room < 1:
            raise ValueError(f"requests[{handle}]: its prompt takes positions up to {start}, the model has {max_positions}")
        if row.limit > room:
            logger.warning("requests[%d]: the prompt leaves %d of the model's %d positions; the row stops at %d new tokens "
                           "unless EOS comes first", handle, room, max_positions, room)
            row.limit = room
