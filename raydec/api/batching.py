"""How the public functions drive the engine over many requests: continuous or consecutive
batches, and progress."""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest

logger = logging.getLogger("raydec.api")


def continuous_batching(device: Any, batching: str = "auto") -> bool:
    """Whether batched decoding on ``device`` gives a finished row's place to the next request
    (``DecodeConfig.batching``: "continuous", "consecutive", or "auto" to decide by device).

    On an accelerator a decode step costs about the same for 1 or ``batch_size`` rows, so a
    finished row's place goes to the next request (continuous batching) instead of the batch
    draining to its slowest row; drafted rows finish many steps apart. On a CPU a step costs
    in proportion to its rows, so a draining batch already gets cheaper and refilling only
    adds prefills and cache copies (measured: no gain at batch 8 on the reference Janus):
    there, "auto" runs requests in consecutive batches.
    """
    if batching == "auto":
        return torch.device(device).type != "cpu"
    if batching not in ("continuous", "consecutive"):
        raise ValueError(f"batching: expected 'auto', 'continuous' or 'consecutive', got {batching!r}")
    return batching == "continuous"


def decode_batches(engine: Engine, requests: list[RowRequest], batch_size: int, continuous: bool, on_finish: Callable[[int, Any], None]) -> list[Any]:
    """Decode ``requests`` at most ``batch_size`` rows at a time: continuously batched, or in
    consecutive batches."""
    if continuous:
        return engine.generate(requests, batch_size=batch_size, on_finish=on_finish)
    outputs = []
    for start in range(0, len(requests), batch_size):
        outputs += engine.generate(requests[start : start + batch_size], on_finish=lambda i, out: on_finish(start + i, out))
    return outputs


def progress_callback(bar: Any, total: int, what: str) -> Callable[[int, Any], None]:
    """An ``Engine.generate`` on_finish callback: advances the progress bar and, for runs of 20
    rows or more, logs each tenth."""
    done = 0
    every = max(1, total // 10)

    def on_finish(_index: int, output: Any) -> None:
        nonlocal done
        done += 1
        if bar is not None:
            bar.update(1)
        if total >= 20 and (done % every == 0 or done == total):
            logger.info("%s: %d/%d finished (last: %.2f tokens per forward)", what, done, total, output.stats.tokens_per_forward)

    return on_finish
