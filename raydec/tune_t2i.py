"""Choose the SJD draft shape (window ``L``, tree ``K`` / ``D``) from this machine's forward costs.

Step compression only pays if the wider forward is cheap enough: on a GPU a 64-token window
costs about what one token costs, on a CPU several times more. So, like EAGLE's tree-size
tuning, we measure instead of guessing:

    cost(n)     seconds of one target forward over n new tokens / a one-token forward's,
                at the batch size that will be served
    steps(c)    target forwards per batch for candidate shape c, counted on a few
                calibration prompts (disjoint from any benchmark's); AR takes N, the
                number of image tokens (prefill included)
    speedup(c)  = (N * cost(1)) / (steps(c) * cost(window(c) + 1))

and keep the candidate with the largest predicted speedup. Counting forwards instead of
timing each candidate keeps the choice stable on a noisy machine; the cost curve is the only
timed part. Decoding stays lossless whatever the shape: the shape only moves speed.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from raydec.config import DecodeConfig, DraftSpec, SamplingConfig, full_tree_nodes

logger = logging.getLogger(__name__)

DEFAULT_WINDOWS: tuple[int, ...] = (8, 16, 32, 48)
DEFAULT_TREES: tuple[tuple[int, int], ...] = ((2, 1), (3, 1), (3, 2))  # (K, D - 1) for sjd_pac


@dataclass(frozen=True)
class TunedShape:
    """One candidate draft shape and what it was measured to give."""

    method: str
    draft: DraftSpec
    steps_per_batch: float  # mean target forwards per batch (prefill included)
    window_cost: float  # cost(window + 1) / cost(1)
    predicted_speedup: float


@torch.inference_mode()
def window_cost(target: Any, prompt: Any, sizes: Sequence[int], batch: int = 1, repeats: int = 5) -> dict[int, float]:
    """Seconds of one target forward over ``n`` new tokens per row after a prefilled prompt,
    for ``batch`` rows, divided by the same for ``sizes[0]`` (normally 1)."""
    from raydec.spec.cache import RaggedCache

    prefix = target.prompt_inputs(prompt)
    embeds = prefix.inputs_embeds if prefix.inputs_embeds is not None else target.embed_prompt_tokens(prefix.input_ids.view(1, -1))[0]
    length = embeds.shape[0]
    cache = RaggedCache(batch, compaction="never")
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool)).expand(batch, -1, -1)
    positions = torch.arange(length).expand(batch, -1)
    target.forward(embeds.expand(batch, -1, -1), None, positions, cache.attention_mask(causal, target.dtype), cache.kv)
    cache.start(torch.ones(batch, length, dtype=torch.bool), torch.full((batch,), length))
    timings: dict[int, float] = {}
    for size in sizes:
        tokens = torch.zeros(batch, size, dtype=torch.long)
        tree = torch.tril(torch.ones(size, size, dtype=torch.bool)).expand(batch, -1, -1)
        mask = cache.attention_mask(tree, target.dtype)
        window_positions = cache.window_positions(torch.arange(size).expand(batch, -1))
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            target.forward(None, tokens, window_positions, mask, cache.kv)
            samples.append(time.perf_counter() - start)
            cache.kv.crop(-size)
        timings[size] = statistics.median(samples)
    return {size: seconds / timings[sizes[0]] for size, seconds in timings.items()}


def candidate_shapes(
    method: str, windows: Sequence[int] = DEFAULT_WINDOWS, trees: Sequence[tuple[int, int]] = DEFAULT_TREES
) -> list[DraftSpec]:
    """Every draft shape worth trying for ``method`` (trees that do not fit a window are skipped)."""
    if method != "sjd_pac":
        return [DraftSpec(window=w) for w in windows]
    return [
        DraftSpec(window=w, branching=k, tree_depth=d)
        for w, (k, d) in itertools.product(windows, trees)
        if full_tree_nodes(k, d) < w
    ]


def tune_draft(
    target: Any,
    method: str,
    prompts: Sequence[str],
    seeds: Sequence[int],
    sampling: SamplingConfig,
    batch: int = 1,
    windows: Sequence[int] = DEFAULT_WINDOWS,
    trees: Sequence[tuple[int, int]] = DEFAULT_TREES,
    costs: dict[int, float] | None = None,
) -> tuple[TunedShape, list[TunedShape]]:
    """The best draft shape of ``method`` for ``target`` at ``batch``, and every candidate tried.

    prompts / seeds: calibration prompts (a few; keep them apart from evaluation prompts).
    costs: a cost curve already measured at this batch (keys: window + 1, and 1).
    """
    from raydec.api import generate_images

    if method not in ("sjd", "sjd_ac", "sjd_pac"):
        raise ValueError(f"method={method!r}: only the Jacobi methods sjd, sjd_ac, sjd_pac have a draft shape to tune")
    shapes = candidate_shapes(method, windows, trees)
    length = int(target.num_image_tokens)
    if costs is None or any(s.window + 1 not in costs for s in shapes):
        costs = window_cost(target, prompts[0], sorted({1} | {s.window + 1 for s in shapes}), batch=batch)
    tried: list[TunedShape] = []
    for draft in shapes:
        config = DecodeConfig(method=method, max_new_tokens=length, sampling=sampling, draft=draft)
        results = generate_images(prompts, model=target, decode=config, seeds=seeds, batch_size=batch)
        forwards = [r.target_forwards for r in results]
        steps = float(np.mean([max(forwards[i : i + batch]) for i in range(0, len(forwards), batch)]))
        cost = costs[draft.window + 1]
        tried.append(TunedShape(method, draft, steps, cost, length * costs[1] / (steps * cost)))
        logger.info("tune %s %s: %.1f steps per batch, predicted speedup %.2f", method, draft, steps, tried[-1].predicted_speedup)
    return max(tried, key=lambda t: t.predicted_speedup), tried
