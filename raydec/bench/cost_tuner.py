"""The bench's cost-model tuner: choose the SJD draft shape (window ``L``, tree ``K`` / ``D``) from
this machine's forward costs. ``raydec bench t2i`` and ``raydec bench caption`` use it; the
product's tuner (what ``generate_images`` and the jobs run) is ``raydec.api.tuner``.

Step compression only pays if the wider forward is cheap enough: on a GPU a 64-token window
costs about what one token costs, on a CPU several times more. So, like EAGLE's tree-size
tuning, we measure instead of guessing:

    cost(n)     seconds of one target forward over n new tokens / a one-token forward's,
                at the batch size that will be served
    steps(c)    target forwards per batch for candidate shape c, counted on a few
                calibration prompts (disjoint from any benchmark's): the slowest row's
                under consecutive batches, the rows' mean under continuous batching; AR
                takes N, the number of image tokens (prefill included)
    step(c)     seconds of one whole decode step of shape c (forward, drafting, verification,
                bookkeeping) / one AR step's, timed in rounds that run every candidate and AR
                one after another (in a rotated order), the median over rounds of each round's
                ratio, then fitted non-decreasing in window and tree size
    speedup(c)  = N / (steps(c) * step(c))

and keep the candidate with the largest predicted speedup. Counting forwards (deterministic for
fixed seeds) instead of timing each candidate's wall time, and timing every candidate against
AR in the same rounds, keeps the choice stable on a busy machine: a slow spell slows a whole
round alike and its ratios hold; the median drops a round that a spell split. The monotone fit
encodes what is known (a wider window or a larger tree never makes a step cheaper) and pools
candidates whose timings contradict it. SJD-PAC's candidates include chains (K = 1: SJD-AC's
shapes), so its pick is never worse than SJD-AC's by prediction; and a tree replaces the best
chain only when its predicted lead exceeds the calibration's noise (paired per-row forwards,
:func:`tree_beats_chain`): a tree's extra work per step is certain, its fewer forwards on a few
prompts are not. The whole step is timed, not
just the forward: at batch > 1 verification and bookkeeping grow with the rows, and a window's
forward in a decode (over a growing cache) costs more than ``cost(n)`` measured after the
prompt. Without step timing (a cost curve given from elsewhere) ``step(c) = cost(window + 1)``.

Before the shapes, the fresh-draft prior (``JacobiDraftConfig.init``: what a never-predicted slot is
guessed as) is chosen by counting forwards at one probe shape: a prior moves acceptance, not
the cost of a step, so the rows' mean forwards decide (every row measures acceptance; the
slowest row of a batch is one image). Copying the left neighbour wins where images hold runs
of one code (flat regions and runs textures; the reference shapes), a uniform guess where
neighbouring codes rarely repeat.
Decoding stays lossless whatever the shape and prior: they only move speed.
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


from raydec.api import continuous_batching, generate_images
from raydec.config import JACOBI_METHODS, DecodeConfig, JacobiDraftConfig, SamplingConfig, full_tree_nodes
from raydec.models.base import decoding_attention, synchronize
from raydec.speculative.cache import RaggedCache

logger = logging.getLogger(__name__)

DEFAULT_WINDOWS: tuple[int, ...] = (8, 16, 32, 48)
DEFAULT_TREES: tuple[tuple[int, int], ...] = ((1, 0), (2, 1), (3, 1), (3, 2))  # (K, D - 1) for sjd_pac; (1, 0): SJD-AC's chain
TIMING_ROUNDS = 3  # rounds of step timing (the counting run is the first)
FRESH_DRAFTS: tuple[str, ...] = ("uniform", "left", "above")  # JacobiDraftConfig.init, in tie-break order


@dataclass(frozen=True)
class TunedShape:
    """One candidate draft shape and what it was measured to give."""

    method: str
    jacobi: JacobiDraftConfig
    steps_per_batch: float  # mean target forwards per batch (prefill included; see calibration_run)
    window_cost: float  # cost(window + 1) / cost(1)
    predicted_speedup: float
    step_cost: float = 0.0  # step(c): one decode step (fitted) / a one-token forward
    measured_step_cost: float = 0.0  # step(c) before the fit: the median over timing rounds


def window_cost(target: Any, prompt: Any, sizes: Sequence[int], batch: int = 1, repeats: int = 9) -> dict[int, float]:
    """Seconds of one target forward over ``n`` new tokens per row after a prefilled prompt,
    for ``batch`` rows, divided by the same for ``sizes[0]`` (normally 1)."""
    return relative_costs(forward_seconds(target, prompt, sizes, batch, repeats), sizes[0])


def relative_costs(seconds: dict[int, float], unit: int = 1) -> dict[int, float]:
    """Forward seconds per window size divided by those of size ``unit`` (normally 1)."""
    return {size: value / seconds[unit] for size, value in seconds.items()}


@torch.inference_mode()
def forward_seconds(target: Any, prompt: Any, sizes: Sequence[int], batch: int = 1, repeats: int = 9) -> dict[int, float]:
    """Median seconds of one target forward over ``n`` new tokens per row (``n`` in ``sizes``)
    after a prefilled prompt, for ``batch`` rows (sizes measured in turn, ``repeats`` rounds)."""
    with decoding_attention(target.device):  # the kernels the engine decodes with
        prefix = target.prompt_inputs(prompt)
        embeds = prefix.inputs_embeds if prefix.inputs_embeds is not None else target.embed_prompt_tokens(prefix.input_ids.view(1, -1))[0]
        length = embeds.shape[0]
        cache = RaggedCache(batch, compaction="never", device=target.device)
        causal = torch.tril(torch.ones(length, length, dtype=torch.bool)).expand(batch, -1, -1)
        positions = torch.arange(length).expand(batch, -1)
        target.forward(embeds.expand(batch, -1, -1), None, positions, cache.attention_mask(causal, target.dtype), cache.kv)
        cache.start(torch.ones(batch, length, dtype=torch.bool), torch.full((batch,), length))
        windows = {}
        for size in sizes:
            tree = torch.tril(torch.ones(size, size, dtype=torch.bool)).expand(batch, -1, -1)
            windows[size] = (torch.zeros(batch, size, dtype=torch.long), cache.window_positions(torch.arange(size).expand(batch, -1)),
                             cache.attention_mask(tree, target.dtype))
        samples: dict[int, list[float]] = {size: [] for size in sizes}
        for _ in range(repeats):  # sizes interleaved: a slow spell of the machine hits all of them alike
            for size, (tokens, window_positions, mask) in windows.items():
                synchronize(target.device)
                start = time.perf_counter()
                target.forward(None, tokens, window_positions, mask, cache.kv)
                synchronize(target.device)
                samples[size].append(time.perf_counter() - start)
                cache.kv.crop(-size)
        timings = {size: statistics.median(values) for size, values in samples.items()}
    return timings


def candidate_shapes(
    method: str, windows: Sequence[int] = DEFAULT_WINDOWS, trees: Sequence[tuple[int, int]] = DEFAULT_TREES
) -> list[JacobiDraftConfig]:
    """Every draft shape worth trying for ``method`` (trees that do not fit a window are skipped).

    Raises ValueError when no shape with a tree (K > 1, D - 1 > 0) is left: SJD-PAC with chains only is SJD-AC.
    """
    if method != "sjd_pac":
        return [JacobiDraftConfig(window=w) for w in windows]
    shapes = [
        JacobiDraftConfig(window=w, branching=k, tree_depth=d)
        for w, (k, d) in itertools.product(windows, trees)
        if full_tree_nodes(k, d) < w
    ]
    if not any(shape.branching > 1 and shape.tree_depth > 0 for shape in shapes):  # chains only: that is sjd_ac
        real = [(k, d) for k, d in trees if k > 1 and d > 0]
        smallest = min((full_tree_nodes(k, d) for k, d in real), default=0) + 1
        raise ValueError(
            f"windows {list(windows)}: no sjd_pac draft tree fits (the smallest of {real} needs a window of "
            f"at least {smallest})"
        )
    return shapes


def is_chain(jacobi: JacobiDraftConfig) -> bool:
    """No proactive tree (K = 1 or D - 1 = 0): the shape runs as SJD-AC's chain."""
    return jacobi.branching == 1 or jacobi.tree_depth == 0


def probe_shape(
    method: str, windows: Sequence[int] = DEFAULT_WINDOWS, trees: Sequence[tuple[int, int]] = DEFAULT_TREES
) -> JacobiDraftConfig:
    """The shape a fresh-draft prior is chosen at: the first candidate of the median window with a
    tree (SJD-PAC), else its chain."""
    middle = sorted(windows)[len(windows) // 2]
    try:
        shapes = candidate_shapes(method, [middle], trees)
    except ValueError:  # no tree fits that window: probe with the chain
        return JacobiDraftConfig(window=middle)
    return next((shape for shape in shapes if shape.branching > 1 and shape.tree_depth > 0), shapes[0])


def choose_fresh_drafts(
    target: Any,
    method: str,
    probe: JacobiDraftConfig,
    prompts: Sequence[str],
    seeds: Sequence[int],
    sampling: SamplingConfig,
    batch: int = 1,
    inits: Sequence[str] = FRESH_DRAFTS,
    batching: str = "auto",
) -> tuple[str, dict[str, float]]:
    """The fresh-draft prior of ``method`` needing the fewest target forwards per image at
    ``probe`` on the calibration prompts, and the forwards of each (ties keep the earlier).

    A prior moves acceptance, which every row measures: the rows' mean forwards, not the
    slowest row's. At batch 8 the slowest of eight rows on two calibration batches is one
    unlucky image, and chose a prior that needed more forwards on the mean row.
    batching: ``DecodeConfig.batching`` of the runs being tuned for."""
    if not inits:
        raise ValueError(f"inits: expected at least one of {FRESH_DRAFTS}, got none")
    length = int(target.num_image_tokens)
    steps = {}
    for init in inits:
        jacobi = JacobiDraftConfig(**{**probe.model_dump(), "init": init})
        config = DecodeConfig(method=method, max_new_tokens=length, sampling=sampling, jacobi=jacobi, batching=batching)
        rows = calibration_rows(target, config, prompts, seeds, batch)
        steps[init] = float(np.mean([r.target_forwards for r in rows]))
        logger.info("tune %s fresh drafts %r at window=%d branching=%d tree_depth=%d: %.1f forwards per image",
                    method, init, jacobi.window, jacobi.branching, jacobi.tree_depth, steps[init])
    return min(inits, key=lambda init: steps[init]), steps


def calibration_rows(target: Any, config: DecodeConfig, prompts: Sequence[str], seeds: Sequence[int], batch: int) -> list:
    """Decode the calibration prompts with ``config`` at ``batch``: one result per image."""
    return generate_images(prompts, model=target, decode=config, seeds=seeds, batch_size=batch)


def calibration_run(
    target: Any, config: DecodeConfig, prompts: Sequence[str], seeds: Sequence[int], batch: int
) -> tuple[float, float]:
    """(target forwards per batch, seconds per forward) of :func:`calibration_counts`."""
    steps, per_step, _ = calibration_counts(target, config, prompts, seeds, batch)
    return steps, per_step


def calibration_counts(
    target: Any, config: DecodeConfig, prompts: Sequence[str], seeds: Sequence[int], batch: int
) -> tuple[float, float, list[int]]:
    """Decode the calibration prompts with ``config``: (target forwards per batch, seconds per
    forward, each row's forwards in prompt order).

    Consecutive batches (``config.batching``; "auto": a CPU): a batch lasts as long as its
    slowest row, so its forwards are that row's. Continuous batching ("auto": an accelerator): a
    finished row's place is refilled, so a full batch advances all its rows each step and
    ``batch`` images take their rows' mean forwards; the slowest row of a calibration run says
    little about a long queue.
    """
    results = calibration_rows(target, config, prompts, seeds, batch)
    forwards = [r.target_forwards for r in results]
    if batch > 1 and continuous_batching(target.device, config.batching):  # latency_s: from the row's admission
        return float(np.mean(forwards)), sum(r.latency_s for r in results) / sum(forwards), forwards
    batches = [results[i : i + batch] for i in range(0, len(results), batch)]
    steps = [max(r.target_forwards for r in rows) for rows in batches]
    seconds = [max(r.latency_s for r in rows) for rows in batches]
    return float(np.mean(steps)), sum(seconds) / sum(steps), forwards


def tree_beats_chain(tree: "TunedShape", chain: "TunedShape", tree_rows: Sequence[int], chain_rows: Sequence[int]) -> bool:
    """Whether ``tree``'s predicted lead over ``chain`` is more than the calibration's noise.

    The same prompts and seeds decode under both, so each row gives a paired log ratio of
    forwards; the lead (log of the predicted speedups' ratio) must exceed twice the standard
    error of those ratios' mean. With one row the noise is unknown and the chain is kept: a
    tree's extra work per step is certain, its fewer forwards are not.
    """
    if len(tree_rows) < 2:
        return False
    ratios = np.log(np.asarray(chain_rows, dtype=float) / np.asarray(tree_rows, dtype=float))
    stderr = float(np.std(ratios, ddof=1)) / np.sqrt(len(ratios))
    lead = float(np.log(tree.predicted_speedup / chain.predicted_speedup))
    return lead > 2.0 * stderr


def fit_step_costs(shapes: Sequence[tuple[int, int]], step_costs: Sequence[float], iterations: int = 500) -> list[float]:
    """The least-squares fit of measured step costs that is non-decreasing in window and in tree
    size: shapes[i] = (window + 1, tree nodes); a shape at least as large in both costs at least
    as much. Isotonic regression over that partial order (Dykstra's alternating projections onto
    "non-decreasing along windows" and "non-decreasing along trees", each by pool-adjacent-
    violators); equal shapes share their mean. Fitted values are means of measured ones: never
    below the smallest, never above the largest."""
    y = np.asarray(step_costs, dtype=float)
    if len(shapes) != len(y):
        raise ValueError(f"shapes: {len(shapes)} shapes for {len(y)} step costs")
    windows = np.asarray([shape[0] for shape in shapes], dtype=float)
    trees = np.asarray([shape[1] for shape in shapes], dtype=float)
    along_windows = lambda v: _monotone_in(v, windows, trees)  # noqa: E731
    along_trees = lambda v: _monotone_in(v, trees, windows)  # noqa: E731
    x, p, q = y.copy(), np.zeros_like(y), np.zeros_like(y)
    for _ in range(iterations):
        a = along_windows(x + p)
        p = x + p - a
        previous, x = x, along_trees(a + q)
        q = a + q - x
        if np.abs(x - previous).max(initial=0.0) < 1e-12 and np.abs(x - along_windows(x)).max(initial=0.0) < 1e-12:
            break
    return [float(v) for v in x]


def _monotone_in(values: np.ndarray, keys: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Least-squares projection of ``values`` onto non-decreasing in ``keys`` within each group of
    equal ``groups`` (pool-adjacent-violators; equal keys pooled)."""
    out = values.copy()
    for group in np.unique(groups):
        members = np.flatnonzero(groups == group)
        blocks: list[list] = []  # [sum, count, key, indices]
        for i in members[np.argsort(keys[members], kind="stable")]:
            if blocks and blocks[-1][2] == keys[i]:
                blocks[-1][0] += values[i]
                blocks[-1][1] += 1
                blocks[-1][3].append(i)
            else:
                blocks.append([values[i], 1, keys[i], [i]])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                total, count, key, indices = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += count
                blocks[-1][2] = key
                blocks[-1][3] += indices
        for total, count, _, indices in blocks:
            out[indices] = total / count
    return out


def timed_step_ratios(
    target: Any, configs: Sequence[DecodeConfig], baseline: DecodeConfig, prompts: Sequence[str], seeds: Sequence[int],
    batch: int, rounds: int, first: Sequence[float] | None = None, first_baseline: float | None = None,
) -> list[float]:
    """Each config's seconds per decode step / the baseline's, the median over ``rounds`` rounds.

    Every round decodes one batch (the first ``batch`` calibration prompts) with the baseline and
    every config, one after another in an order rotated each round, and takes each config's
    ratio to the baseline in that round: conditions that change between rounds (another process,
    a frequency step) cancel. ``first`` / ``first_baseline``: seconds per step of a round already
    run (the counting runs), used as round one.
    """
    runs = [baseline, *configs]
    ratios: list[list[float]] = [[] for _ in configs]
    if first is not None and first_baseline is not None:
        for samples, seconds in zip(ratios, first):
            samples.append(seconds / first_baseline)
        rounds -= 1
    one_batch = max(1, min(batch, len(prompts)))
    for turn in range(max(0, rounds)):
        order = list(range(len(runs)))
        order = order[turn % len(order):] + order[: turn % len(order)]
        per_step = {}
        for index in order:
            _, per_step[index] = calibration_run(target, runs[index], prompts[:one_batch], seeds[:one_batch], one_batch)
        for i, samples in enumerate(ratios):
            samples.append(per_step[i + 1] / per_step[0])
    return [statistics.median(samples) for samples in ratios]


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
    one_token_seconds: float | None = None,
    ar_step: float | None = None,
    inits: Sequence[str] = FRESH_DRAFTS,
    batching: str = "auto",
    rounds: int = TIMING_ROUNDS,
    chain_init: str | None = None,
) -> tuple[TunedShape, list[TunedShape]]:
    """The best draft shape of ``method`` for ``target`` at ``batch``, and every candidate tried.

    prompts / seeds: calibration prompts (a few, at least ``batch``; keep them apart from
    evaluation prompts). inits: fresh-draft priors to choose from first (just one: use it).
    chain_init: SJD-PAC's prior for its chains (K = 1: SJD-AC's shapes), chosen as SJD-AC's
    would be (at SJD-AC's probe) when ``inits`` has several and this is None; otherwise the
    trees' prior. A prior good for trees can be poor for chains (copies from above feed a
    tree's siblings, copies from the left a long chain), and the chains must be the ones SJD-AC
    would pick for SJD-PAC's search to hold SJD-AC's.
    costs: a cost curve already measured at this batch (keys: window + 1, and 1). one_token_seconds: the absolute seconds behind ``costs[1]``; with it whole decode
    steps are timed (``ar_step`` = step(ar) is measured when not given). Without it (a cost
    curve from elsewhere) the prediction counts forwards only. rounds: rounds of step timing
    (:func:`timed_step_ratios`; only when ``ar_step`` is measured here). batching: ``DecodeConfig.batching``
    of the runs being tuned for (it decides whether a batch's forwards are its slowest row's or
    its rows' mean).
    """
    if method not in JACOBI_METHODS:
        raise ValueError(f"method={method!r}: only the Jacobi methods sjd, sjd_ac, sjd_pac have a draft shape to tune")
    init, chain_init = draft_priors(target, method, prompts, seeds, sampling, batch, windows, trees, inits, batching, chain_init)
    shapes = [JacobiDraftConfig(**{**shape.model_dump(), "init": chain_init if is_chain(shape) else init})
              for shape in candidate_shapes(method, windows, trees)]
    length = int(target.num_image_tokens)
    if costs is None or any(s.window + 1 not in costs for s in shapes):
        seconds = forward_seconds(target, prompts[0], sorted({1} | {s.window + 1 for s in shapes}), batch=batch)
        one_token_seconds, costs = seconds[1], relative_costs(seconds)
    timed = one_token_seconds is not None
    configs = [DecodeConfig(method=method, max_new_tokens=length, sampling=sampling, jacobi=jacobi, batching=batching) for jacobi in shapes]
    counted, first, rows = [], [], []  # steps per batch; seconds per step of the counting runs; rows' forwards
    for config in configs:
        steps, per_step, forwards = calibration_counts(target, config, prompts, seeds, batch)
        counted.append(steps)
        first.append(per_step)
        rows.append(forwards)
    sizes = [(jacobi.window + 1, full_tree_nodes(jacobi.branching, jacobi.tree_depth)) for jacobi in shapes]
    if timed:
        ar = DecodeConfig(method="ar", max_new_tokens=length, sampling=sampling, batching=batching)
        if ar_step is None:  # AR timed in the same rounds: step(c) as a ratio to step(ar)
            _, ar_seconds = calibration_run(target, ar, prompts, seeds, batch)
            ratios = timed_step_ratios(target, configs, ar, prompts, seeds, batch, rounds, first, ar_seconds)
            ar_step = ar_seconds / one_token_seconds
            measured = [ratio * ar_step for ratio in ratios]
        else:  # step(ar) given: step(c) against the one-token forward
            measured = [per_step / one_token_seconds for per_step in first]
        step_costs = fit_step_costs(sizes, measured)
        base = ar_step
    else:
        measured = step_costs = [costs[jacobi.window + 1] for jacobi in shapes]
        base = costs[1]
    tried = []
    for jacobi, steps, step, raw in zip(shapes, counted, step_costs, measured):
        tried.append(TunedShape(method, jacobi, steps, costs[jacobi.window + 1], length * base / (steps * step), step, raw))
        logger.info("tune %s %s: %.1f steps per batch, step cost %.2f (measured %.2f), predicted speedup %.2f",
                    method, jacobi, steps, step, raw, tried[-1].predicted_speedup)
    return best_shape(method, tried, rows), tried


def draft_priors(
    target: Any, method: str, prompts: Sequence[str], seeds: Sequence[int], sampling: SamplingConfig, batch: int,
    windows: Sequence[int], trees: Sequence[tuple[int, int]], inits: Sequence[str], batching: str, chain_init: str | None,
) -> tuple[str, str]:
    """:func:`tune_draft`'s fresh-draft priors -> (the trees' prior, the chains' prior).

    One entry in ``inits`` is used as it is; several are counted at ``method``'s probe shape
    (:func:`choose_fresh_drafts`; an empty list is refused there), and for SJD-PAC without a
    ``chain_init`` the chains' prior is counted at SJD-AC's probe, as SJD-AC would choose it.
    """
    if len(inits) == 1:
        init = inits[0]
    else:  # refuses an empty list
        init, _ = choose_fresh_drafts(target, method, probe_shape(method, windows, trees), prompts, seeds, sampling, batch, inits, batching)
        if method == "sjd_pac" and chain_init is None:
            chain_init, _ = choose_fresh_drafts(target, "sjd_ac", probe_shape("sjd_ac", windows), prompts, seeds, sampling, batch, inits, batching)
    return init, chain_init or init


def best_shape(method: str, tried: Sequence[TunedShape], rows: Sequence[Sequence[int]]) -> TunedShape:
    """The candidate with the largest predicted speedup; for SJD-PAC the best chain instead of a
    tree that leads it by no more than the calibration's noise (:func:`tree_beats_chain` on the
    rows' forwards, ``rows[i]`` for ``tried[i]``)."""
    best = max(tried, key=lambda t: t.predicted_speedup)
    chains = [i for i, t in enumerate(tried) if is_chain(t.jacobi)]
    if method == "sjd_pac" and chains and best not in [tried[i] for i in chains]:
        chain = max(chains, key=lambda i: tried[i].predicted_speedup)
        if not tree_beats_chain(best, tried[chain], rows[tried.index(best)], rows[chain]):
            logger.info("tune sjd_pac: the tree %s leads the chain %s by %.2fx, within the calibration's noise: "
                        "keeping the chain", best.jacobi, tried[chain].jacobi, best.predicted_speedup / tried[chain].predicted_speedup)
            best = tried[chain]
    return best
