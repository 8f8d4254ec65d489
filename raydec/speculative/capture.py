"""Captured step work: a decode step's pure tensor functions compiled at fixed shapes.

Outside the target forward, a step is a few hundred small operators (propose, process, verify,
carry drafts over). On a GPU each is a kernel launch of about 12 microseconds, so a step is
launch-bound; captured, each function below is one graph launch. A ``StepGraph`` wraps one
such function:

    graph = StepGraph(fn, "verify", enabled=True, device=device)
    outputs = graph(rows, (batch tensors...), (shared tensors...), **static)

- batch tensors lead with the rows ([B, ...]); on CUDA they are padded to the batch's bucket
  (``batch_bucket``: 1, 2, 4, 8, 16, 32, 64, ... rows) by repeating the last row, and every
  output, also [bucket, ...], is cut back to B rows. A padded row is a copy of a real one and
  rows never mix (every function here works row by row), so a row's output does not depend on
  its bucket;
- shared tensors (layouts, a vocabulary mask) go in as they are;
- static arguments (ints, flags, configs) are constants of the captured graph.

On CUDA, ``fn`` is compiled per (bucket, shapes, static arguments) with ``torch.compile`` in
"reduce-overhead" mode, which records it as a CUDA graph; outputs of a CUDA graph live in memory
its next replay writes over, so they are cloned before they leave. Elsewhere (a CPU) there is
nothing to replay: ``fn`` is compiled once with the rows as a dynamic size, unpadded (a single
row runs padded to two, which a dynamic size needs), so a batch that drains row by row compiles
no more.
Disabled, the function runs eagerly with no padding.

``compile: auto | on | off`` (``DecodeConfig.compile``) decides: ``resolve_compile``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Literal

import torch

logger = logging.getLogger(__name__)

CompileMode = Literal["auto", "on", "off"]

#: batch sizes a captured function is compiled for; a batch runs padded to the first that holds it
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def batch_bucket(rows: int) -> int:
    """The bucket a batch of ``rows`` runs at: the smallest of ``BATCH_BUCKETS`` that holds it,
    beyond the largest a multiple of it."""
    if rows < 1:
        raise ValueError(f"a batch has at least one row, got {rows}")
    for bucket in BATCH_BUCKETS:
        if rows <= bucket:
            return bucket
    largest = BATCH_BUCKETS[-1]
    return -(-rows // largest) * largest


def resolve_compile(mode: CompileMode, device: torch.device | str) -> bool:
    """Whether a session on ``device`` captures its step: ``on`` / ``off`` as said; ``auto``: on
    for CUDA, off elsewhere. On a CPU there are no launches to save: a captured Jacobi step
    measured about as fast as an eager one, a draft-tree step faster, and each graph first
    compiles for tens of seconds (docs/engine.md, "Captured steps")."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"compile: {mode!r}; choose auto, on or off")
    if mode == "auto":
        return torch.device(device).type == "cuda"
    return mode == "on"


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` ([B, ...]) with its last row repeated up to ``rows`` rows."""
    missing = rows - tensor.shape[0]
    if missing <= 0:
        return tensor
    return torch.cat([tensor, tensor[-1:].expand(missing, *tensor.shape[1:])])


class StepGraph:
    """One pure tensor function of a step, captured (see module docstring)."""

    def __init__(
        self, fn: Callable[..., tuple[torch.Tensor, ...]], name: str, enabled: bool, device: torch.device | str,
        lengths: tuple[tuple[int, int], ...] = (),
    ) -> None:
        """lengths: (batch tensor, dim) pairs of sizes that vary between calls besides the rows
        (a buffer's capacity): off CUDA they are dynamic sizes of the one graph too."""
        self.fn = fn
        self.lengths = lengths
        self.name = name
        self.enabled = enabled
        self.device = torch.device(device)
        self.graph_mode = self.device.type == "cuda"  # CUDA graphs at fixed buckets; elsewhere one graph for every batch
        self._compiled: Callable[..., tuple[torch.Tensor, ...]] | None = None
        self.calls = 0  # captured calls (one graph launch each when recorded as a CUDA graph)

    def _function(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        if self._compiled is None:
            if self.graph_mode:
                self._compiled = torch.compile(self.fn, dynamic=False, fullgraph=True, mode="reduce-overhead")
            else:
                self._compiled = torch.compile(self.fn, fullgraph=True)
        return self._compiled

    def __call__(self, rows: int, batch: tuple[torch.Tensor, ...], shared: tuple[Any, ...] = (), **static: Any) -> tuple[torch.Tensor, ...]:
        """``fn(*batch, *shared, **static)``; batch tensors [rows, ...] -> outputs [rows, ...]."""
        if not self.enabled:
            return self.fn(*batch, *shared, **static)
        self.calls += 1
        if not self.graph_mode:  # the rows are a dynamic size of one graph; a single row runs padded to two
            padded = tuple(pad_rows(t, 2) for t in batch)
            for tensor in padded:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
            for index, dim in self.lengths:
                torch._dynamo.maybe_mark_dynamic(padded[index], dim)
            outputs = self._function()(*padded, *shared, **static)
            return outputs if rows > 1 else tuple(out[:rows] for out in outputs)
        bucket = batch_bucket(rows)
        padded = tuple(pad_rows(t, bucket) for t in batch)
        torch.compiler.cudagraph_mark_step_begin()
        outputs = self._function()(*padded, *shared, **static)
        return tuple(out[:rows].clone() for out in outputs)
