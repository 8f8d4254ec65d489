"""What crosses between a replica and its engine process (pickled over one socket pair): requests,
cancellations and calls one way; events, in one message per engine turn, and replies back.

    replica -> engine:  Submit, Cancel, Call, Stop
    engine -> replica:  Ready or StartFailed (once, after the model loaded), Emitted (a turn's events), Reply

Images leave the engine as raw pixels (``boundary.RawImage``): PNG encoding happens in the replica, off the
engine's interpreter. This module is light (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from raydec.serve.boundary import ChatRequest, Event, ImageRequest, ModelInfo


@dataclass(frozen=True)
class RowTiming:
    """When a finished row was admitted and gave its first token (``time.perf_counter``, the same
    monotonic clock in every process of the node), and the draft tokens it verified per step."""

    admitted_at: Optional[float]
    first_token_at: Optional[float]
    draft_per_step: int


# -- replica -> engine ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """Request ``rid``: an image request's ``n`` rows (seeds from ``seed``) or one chat."""

    rid: int
    request: Union[ImageRequest, ChatRequest]
    seed: int


@dataclass(frozen=True)
class Cancel:
    rid: int


@dataclass(frozen=True)
class Call:
    """Run the engine host's method ``name`` (stats, decoding) and reply under ``cid``."""

    cid: int
    name: str


@dataclass(frozen=True)
class Stop:
    pass


# -- engine -> replica ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The model loaded: what the replica answers without asking again."""

    info: ModelInfo
    plan: dict[str, Any]  # DecodePlan.record()
    pid: int
    summary: str  # "model NAME (task, model) ready in S s on DEVICE: the plan in words", for the replica's log


@dataclass(frozen=True)
class Emitted:
    """One engine turn's events, in order: (request id, event, its row's timing when the event ends the row);
    when a row finished in the turn, the engine's mean batch size and decode steps per plan so far (metrics)."""

    events: list[tuple[int, Event, Optional[RowTiming]]] = field(default_factory=list)
    mean_batch_size: Optional[float] = None
    plan_steps: Optional[dict[str, int]] = None


@dataclass(frozen=True)
class StartFailed:
    """The engine could not start (the model did not load, the plan failed): the error, in words."""

    error: str


@dataclass(frozen=True)
class Reply:
    cid: int
    value: Any = None
    error: Optional[str] = None


ToEngine = Union[Submit, Cancel, Call, Stop]
FromEngine = Union[Ready, StartFailed, Emitted, Reply]
