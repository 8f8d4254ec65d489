"""What a decode session takes and gives back: one request per row, its statistics and its
output, and the session's host-side record of a row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import torch

from raydec.config import SamplingConfig

# How a row's sampled tokens follow from its seed: "rejection" (recursive rejection sampling: the
# target's law, tokens that depend on the drafts) or "gumbel" (Gumbel-max with noise fixed per
# generated position: the target's law, the same tokens whatever was drafted)
Coupling = Literal["rejection", "gumbel"]
COUPLINGS: tuple[str, ...] = ("rejection", "gumbel")


@dataclass
class RowRequest:
    """One generation request: an adapter-specific prompt, a seed, and optionally its own
    length cap, sampling (temperature, top-k, top-p, repetition penalty; CFG is the engine's)
    and stop tokens (besides the model's EOS), and how its samples are coupled to the seed
    ("rejection" or "gumbel"; the engine's when None)."""

    prompt: Any
    seed: int
    max_new_tokens: int | None = None
    sampling: SamplingConfig | None = None
    stop_token_ids: Sequence[int] = ()
    coupling: Coupling | None = None


@dataclass
class RowStats:
    """Per-row decoding statistics. ``target_forwards`` includes the prefill."""

    target_forwards: int = 0
    accepted_lengths: list[int] = field(default_factory=list)  # tokens committed per decode forward
    wall_time_s: float = 0.0
    finish_reason: str = ""

    @property
    def tokens_per_forward(self) -> float:
        tokens = 1 + sum(self.accepted_lengths)
        return tokens / max(1, self.target_forwards)


@dataclass
class RowOutput:
    tokens: list[int]
    stats: RowStats


@dataclass
class RowState:
    """One submitted request's state in a session (host side)."""

    request: RowRequest
    limit: int
    stats: RowStats = field(default_factory=RowStats)
    generated: list[int] = field(default_factory=list)
    admitted_at: float = 0.0  # perf_counter when the row was prefilled (its latency starts)
    sampling: SamplingConfig | None = None  # the engine's when None
    stop: frozenset[int] = frozenset()  # EOS and the request's stop tokens
    context_ids: torch.Tensor | None = None  # prompt token ids (repetition penalty)
    cancelled: bool = False
    done: bool = False
