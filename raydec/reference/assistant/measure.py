"""Measuring the LLaVA assistant: HF assisted generation vs plain generation, and its tuning.

``measure_assisted`` decodes held-out images at batch 1, greedy, with and without the
assistant: identical outputs, wall-time ratio, target and assistant forwards (forward hooks),
tokens per target forward and draft acceptance. ``tune_assisted_config`` picks the draft
length and confidence threshold HF reads from the assistant's generation config, by wall
time on held-in images.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import numpy as np
import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.llava.model import prompt_text
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

logger = logging.getLogger(__name__)


class _ForwardCounter:
    """Counts ``forward`` calls of a module (a forward hook)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.count += 1

    def remove(self) -> None:
        self._handle.remove()


def _summary(rows: list[dict[str, Any]], assistant: LlavaForConditionalGeneration, first_seed: int,
             max_new_tokens: int, repeats: int) -> dict[str, Any]:
    """The measurement's totals, ratios and acceptance over the per-image ``rows``."""
    ratios = [r["assisted_s"] / r["plain_s"] for r in rows]
    tokens = sum(r["new_tokens"] for r in rows)
    rounds = sum(r["target_forwards"] for r in rows)
    drafted = sum(r["assistant_forwards"] for r in rows)
    return {
        "images": len(rows),
        "first_seed": first_seed,
        "max_new_tokens": max_new_tokens,
        "repeats": max(1, repeats),
        "num_assistant_tokens": assistant.generation_config.num_assistant_tokens or 20,
        "assistant_confidence_threshold": 0.4 if assistant.generation_config.assistant_confidence_threshold is None
        else assistant.generation_config.assistant_confidence_threshold,
        "identical": sum(r["identical"] for r in rows),
        "mean_time_ratio": float(np.mean(ratios)),
        "median_time_ratio": float(np.median(ratios)),
        "total_plain_s": float(sum(r["plain_s"] for r in rows)),
        "total_assisted_s": float(sum(r["assisted_s"] for r in rows)),
        "new_tokens": int(tokens),
        "target_forwards": int(rounds),
        "assistant_forwards": int(drafted),
        "tokens_per_target_forward": tokens / max(rounds, 1),
        "acceptance": (tokens - rounds) / max(drafted, 1),
        "per_image": rows,
    }


@torch.no_grad()
def measure_assisted(
    target: LlavaForConditionalGeneration,
    assistant: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    n: int = 50,
    first_seed: int = HELD_OUT_SEED_START,
    max_new_tokens: int = 96,
    repeats: int = 1,
) -> dict[str, Any]:
    """Batch 1, greedy, held-out images ``first_seed..``: HF assisted vs plain ``generate``.

    With ``repeats`` > 1 each image's plain / assisted pair runs that many times (interleaved) and
    each side keeps its fastest time, which filters out stalls from other jobs on a shared CPU.

    Per image: plain then assisted generation (timed, after one untimed warm-up of each), the
    outputs compared, forwards of the target and the assistant counted by forward hooks. The
    target runs once per verification round, so new tokens / target forwards is the tokens per
    round; each round adds exactly one target token, so accepted draft tokens = new tokens -
    rounds, and (one assistant forward per drafted token) acceptance = accepted / assistant
    forwards.
    """
    target.eval()
    assistant.eval()
    target_calls, assistant_calls = _ForwardCounter(target), _ForwardCounter(assistant)
    rows = []
    try:
        for index, seed in enumerate([first_seed] + list(range(first_seed, first_seed + n))):
            inputs = processor(text=[prompt_text()], images=[make_sample(seed).image], return_tensors="pt")
            width = inputs["input_ids"].shape[1]
            plain_s, assisted_s, identical = [], [], True
            for _ in range(max(1, repeats)):
                t0 = time.perf_counter()
                plain = target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
                t1 = time.perf_counter()
                target_calls.count = assistant_calls.count = 0
                t2 = time.perf_counter()
                assisted = target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                           assistant_model=assistant)
                t3 = time.perf_counter()
                plain_s.append(t1 - t0)
                assisted_s.append(t3 - t2)
                identical = identical and bool(torch.equal(plain, assisted))
            if index == 0:
                continue  # warm-up
            new_tokens = assisted.shape[1] - width
            rows.append({
                "seed": seed,
                "identical": identical,
                "plain_s": min(plain_s),
                "assisted_s": min(assisted_s),
                "new_tokens": int(new_tokens),
                "target_forwards": target_calls.count,
                "assistant_forwards": assistant_calls.count,
            })
    finally:
        target_calls.remove()
        assistant_calls.remove()
    result = _summary(rows, assistant, first_seed, max_new_tokens, repeats)
    logger.info("assisted vs plain on %d held-out images: %d identical, mean time ratio %.3f, %.2f tokens per "
                "target forward, acceptance %.3f", len(rows), result["identical"], result["mean_time_ratio"],
                result["tokens_per_target_forward"], result["acceptance"])
    return result


TUNING_GRID: tuple[tuple[int, float], ...] = ((20, 0.4), (20, 0.0), (10, 0.4), (10, 0.0), (6, 0.4), (6, 0.0), (4, 0.0))


@torch.no_grad()
def tune_assisted_config(
    target: LlavaForConditionalGeneration,
    assistant: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    n: int = 8,
    first_seed: int = 990_000,
    max_new_tokens: int = 96,
    grid: Sequence[tuple[int, float]] = TUNING_GRID,
) -> dict[str, Any]:
    """Pick ``num_assistant_tokens`` and ``assistant_confidence_threshold`` by wall time on held-in images.

    HF assisted generation reads both from the assistant's ``generation_config`` (defaults 20 and
    0.4). Each image is decoded with every grid entry in turn (so load drift hits all alike),
    batch 1, greedy; the fastest total is written into ``assistant.generation_config`` (and so
    ships with the weights). Seeds ``first_seed..`` are held-in (< 1,000,000), not the measured ones.
    """
    seconds = [0.0] * len(grid)
    for index, seed in enumerate([first_seed] + list(range(first_seed, first_seed + n))):
        inputs = processor(text=[prompt_text()], images=[make_sample(seed).image], return_tensors="pt")
        for k, (tokens, threshold) in enumerate(grid):
            assistant.generation_config.num_assistant_tokens = tokens
            assistant.generation_config.assistant_confidence_threshold = threshold
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            t0 = time.perf_counter()
            target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=assistant)
            if index > 0:  # the first image is a warm-up
                seconds[k] += time.perf_counter() - t0
    best = int(np.argmin(seconds))
    tokens, threshold = grid[best]
    assistant.generation_config.num_assistant_tokens = tokens
    assistant.generation_config.assistant_confidence_threshold = threshold
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    table = [{"num_assistant_tokens": t, "assistant_confidence_threshold": c, "seconds": s}
             for (t, c), s in zip(grid, seconds)]
    logger.info("assisted-generation settings on %d held-in images: %s -> num_assistant_tokens %d, threshold %.2f", n,
                ", ".join(f"({r['num_assistant_tokens']}, {r['assistant_confidence_threshold']}): {r['seconds']:.2f} s"
                          for r in table), tokens, threshold)
    return {"images": n, "first_seed": first_seed, "grid": table, "num_assistant_tokens": tokens,
            "assistant_confidence_threshold": threshold}
