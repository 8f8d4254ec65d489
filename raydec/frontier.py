"""The draft shape for a batch size, with plain AR among the candidates.

Speculation trades a wider forward for fewer of them. At batch 1 the wider forward is nearly
free; as the batch grows each forward already fills the device, a draft window multiplies its
work, and the trade stops paying, first for wide shapes, then for all. So the shape is chosen
for the batch it will decode, by measuring, and "no speculation" is a candidate:

    for each round (the order of the candidates rotated each round):
        seconds(c) = wall seconds to decode the calibration rows at the batch with config c
        ratio(c)   = seconds(ar) / seconds(c)            AR decoded in the same round
    chosen = argmax over candidates of median_round ratio(c), AR (ratio 1) included

Timing every candidate against AR in the same round keeps the choice stable on a busy machine:
a slow spell slows a round alike and its ratios hold; the median drops a round a spell split.
The measure is throughput (rows per second at the batch), which is what a batch job buys; a
latency-bound caller at batch 1 gets the same answer, since one row's latency is its
throughput. Every candidate decodes losslessly: the choice moves speed, never the output law.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from raydec.config import (
    DRAFT_METHODS, JACOBI_METHODS, DecodeConfig, DraftTreeConfig, JacobiDraftConfig, full_tree_nodes,
)

logger = logging.getLogger(__name__)

WINDOWS: tuple[int, ...] = (8, 16, 32, 48)  # SJD windows tried (L - 1)
PAC_TREES: tuple[tuple[int, int], ...] = ((1, 0), (3, 1))  # (K, D - 1) for sjd_pac: a chain and the default tree
DRAFT_TREES: tuple[tuple[int, int, int], ...] = ((3, 2, 6), (6, 2, 12), (6, 3, 20), (8, 4, 32))  # (depth, top_k, total_tokens)
ROUNDS = 2


@dataclass(frozen=True)
class ShapeTrial:
    """One candidate and what it measured: rows per second, and its median ratio to AR's in the same rounds."""

    config: DecodeConfig
    rows_per_s: float
    ratio_to_ar: float


def shape_label(config: DecodeConfig) -> str:
    """A short name of a config's draft shape: ``ar``, ``window=16``, ``window=16,K=3,D=1``, ``tree=6x2/12``."""
    if config.method == "ar":
        return "ar"
    if config.method in JACOBI_METHODS:
        draft = config.draft
        tree = f",K={draft.branching},D={draft.tree_depth}" if draft.branching > 1 and draft.tree_depth > 0 else ""
        return f"window={draft.window}{tree}"
    tree = config.tree
    return f"tree={tree.depth}x{tree.top_k}/{tree.total_tokens}"


def candidate_configs(
    base: DecodeConfig,
    windows: Sequence[int] = WINDOWS,
    pac_trees: Sequence[tuple[int, int]] = PAC_TREES,
    draft_trees: Sequence[tuple[int, int, int]] = DRAFT_TREES,
) -> list[DecodeConfig]:
    """Plain AR, then every shape of ``base.method`` worth trying (its prior, sampling and draft kept)."""
    ar = base.model_copy(update={"method": "ar"})
    if base.method == "ar":
        return [ar]
    shapes: list[DecodeConfig] = []
    if base.method in JACOBI_METHODS:
        trees = pac_trees if base.method == "sjd_pac" else [(1, 0)]
        for window, (branching, depth) in itertools.product(windows, trees):
            if branching > 1 and full_tree_nodes(branching, depth) >= window:
                continue  # the tree does not fit the window
            draft = JacobiDraftConfig(**{**base.draft.model_dump(), "window": window, "branching": branching, "tree_depth": depth})
            shapes.append(base.model_copy(update={"draft": draft}))
    elif base.method in DRAFT_METHODS:
        for depth, top_k, total in draft_trees:
            shapes.append(base.model_copy(update={"draft_tree": DraftTreeConfig(depth=depth, top_k=top_k, total_tokens=total)}))
    else:
        raise ValueError(f"method={base.method!r}: no draft shape to choose")
    return [ar, *shapes]


def tune_for_batch(
    decode_seconds: Callable[[DecodeConfig], float],
    candidates: Sequence[DecodeConfig],
    rows: int,
    rounds: int = ROUNDS,
) -> tuple[DecodeConfig, list[ShapeTrial]]:
    """The candidate with the best median throughput ratio to AR, and every trial.

    decode_seconds(config): decode the calibration rows (``rows`` of them, at the batch being
    tuned for) with ``config`` and return the wall seconds. candidates: AR first (see
    :func:`candidate_configs`). Ties keep the earlier candidate, so AR wins a tie.
    """
    if not candidates or candidates[0].method != "ar":
        raise ValueError("candidates: plain AR must come first (it is the baseline every round is timed against)")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    seconds: list[list[float]] = [[] for _ in candidates]
    for turn in range(rounds):
        order = list(range(len(candidates)))
        order = order[turn % len(order):] + order[: turn % len(order)]
        for index in order:
            seconds[index].append(decode_seconds(candidates[index]))
    trials = []
    for config, samples in zip(candidates, seconds):
        ratio = statistics.median(ar / own for ar, own in zip(seconds[0], samples))
        trials.append(ShapeTrial(config, rows / statistics.median(samples), ratio))
        logger.info("tune %s %s: %.2f rows/s, %.2fx AR", config.method, shape_label(config), trials[-1].rows_per_s, ratio)
    best = max(range(len(trials)), key=lambda i: (trials[i].ratio_to_ar, -i))
    return candidates[best], trials
