"""Rows joining a session: their prompts' prefill, in one forward or in chunks over several steps.

An admission left-pads the joining rows' prompts into one window ``[M, L]`` (model rows: with
classifier-free guidance each request's conditional row, then its unconditional one) and runs the
target over it into a cache of its own. Under a prefill budget a window wider than the budget runs
in chunks of positions, one per session step, each attending to the chunks before it through that
cache, so the rows already decoding wait out one chunk per step instead of the whole prompt:

    chunk k: queries L[a:b], keys L[0:b]   (mask[:, :, a:b, :b] of the window's causal mask)

The hidden states of every chunk are kept for draft models, the logits of the last position for the
first token. A chunked prefill computes what the one forward computes, position by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from raydec.speculative.cache import RaggedCache
from raydec.speculative.requests import RowState
from raydec.speculative.target import DecodingTarget, ForwardOutput


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
