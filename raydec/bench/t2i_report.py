"""What ``raydec bench t2i`` reports: each method's record, its summary against AR (and ``hf``),
the printed tables, the judge-score agreement test and the acceptance plots. Measuring is
``raydec.bench.t2i``'s; this module only turns the records into numbers, tables and pictures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raydec.bench.common import print_table, ratio_cell


@dataclass
class MethodRecord:
    """What one method measured over the run: its seconds, and per image its forwards, tokens,
    tokens committed per decode forward and judge score."""

    seconds: float = 0.0
    forwards: list[int] = field(default_factory=list)       # per image, prefill included
    tokens: list[int] = field(default_factory=list)
    accepted_lengths: list[list[int]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)


def t2i_summary(records: dict[str, MethodRecord]) -> dict[str, dict[str, float]]:
    """Per method: step compression (AR forwards / the method's, per image, then the mean), latency
    speedup vs AR (and vs ``hf`` when it ran), tokens per forward, judge score, images per second;
    for the methods other than AR the judge-score agreement with AR's (``score_agreement``)."""
    ar = records["ar"]
    summary: dict[str, dict[str, float]] = {}
    for method, record in records.items():
        entry = {
            "step_compression": float(np.mean([a / m for a, m in zip(ar.forwards, record.forwards)])),
            "latency_speedup": ar.seconds / record.seconds,
            "tokens_per_forward": sum(record.tokens) / max(1, sum(record.forwards)),
            "judge_score": float(np.mean(record.scores)),
            "seconds": record.seconds,
            "images_per_second": len(record.scores) / record.seconds,
        }
        if "hf" in records:
            entry["latency_speedup_vs_hf"] = records["hf"].seconds / record.seconds
        if method != "ar":
            entry.update(score_agreement(ar.scores, record.scores))
        summary[method] = entry
    return summary


def summary_table(summary: dict[str, dict[str, float]]) -> tuple[list[str], list[list[str]]]:
    """The printed table of ``t2i_summary``: (header, one row per method)."""
    header = ["method", "step compr.", "latency x AR", "latency x hf", "tokens/fwd", "judge", "judge vs AR (p KS/MW)", "img/s"]
    rows = [
        [m, f"{e['step_compression']:.2f}", f"{e['latency_speedup']:.2f}", ratio_cell(e, "latency_speedup_vs_hf"),
         f"{e['tokens_per_forward']:.2f}", f"{e['judge_score']:.3f}",
         f"{e['judge_mean_diff']:+.3f} ({e['judge_ks_p']:.2f}/{e['judge_mw_p']:.2f})" if "judge_ks_p" in e else "-",
         f"{e['images_per_second']:.3f}"]
        for m, e in summary.items()
    ]
    return header, rows


def print_tuning(priors: list, tried: list, batch: int, prompts: int | None) -> None:
    """The tuner's tables, when it ran: the fresh-draft priors tried (method, probe shape, forwards
    per image of each prior, chosen) and the draft shapes tried (``TunedShape``), on ``prompts``
    calibration prompts at ``batch``."""
    if priors:
        print_table(
            f"fresh-draft priors tried at batch {batch} on {prompts} calibration prompts (target forwards per image)",
            ["method", "probe window", "K", "D-1"] + list(priors[0][2]) + ["chosen"],
            [[m, probe.window, probe.branching, probe.tree_depth] + [f"{v:.1f}" for v in steps.values()] + [init]
             for m, probe, steps, init in priors],
        )
    if tried:
        print_table(
            f"draft shapes tried at batch {batch} on {prompts} calibration prompts "
            "(costs in one-token forwards; step = a whole decode step: median of interleaved rounds, then fitted)",
            ["method", "window", "K", "D-1", "prior", "steps/batch", "window cost", "step measured", "step fitted", "predicted x AR"],
            [[t.method, t.jacobi.window, t.jacobi.branching, t.jacobi.tree_depth, t.jacobi.init, f"{t.steps_per_batch:.1f}",
              f"{t.window_cost:.2f}", f"{t.measured_step_cost:.2f}", f"{t.step_cost:.2f}", f"{t.predicted_speedup:.2f}"] for t in tried],
        )


def tuning_json(priors: list, tried: list) -> dict[str, list[dict[str, Any]]]:
    """The tuner's choices as the result JSON keeps them: "fresh_drafts" and "tuning"."""
    return {
        "fresh_drafts": [
            {"method": m, "probe": probe.model_dump(), "steps_per_batch": steps, "chosen": init} for m, probe, steps, init in priors
        ],
        "tuning": [
            {"method": t.method, "jacobi": t.jacobi.model_dump(), "steps_per_batch": t.steps_per_batch,
             "window_cost": t.window_cost, "step_cost": t.step_cost,
             "predicted_speedup": t.predicted_speedup}
            for t in tried
        ],
    }


def score_agreement(reference: list[float], scores: list[float], alpha: float = 0.05) -> dict[str, float]:
    """Does a method's judge-score distribution match AR's? Two-sample Kolmogorov-Smirnov and
    Mann-Whitney tests (both must not reject at ``alpha``) and the difference of the means.
    Lossless methods pass by construction up to sampling noise; biased ones drift."""
    from scipy import stats

    if len(reference) < 2 or len(scores) < 2 or (len(set(reference)) == 1 and set(reference) == set(scores)):
        return {"judge_ks_p": 1.0, "judge_mw_p": 1.0, "judge_mean_diff": float(np.mean(scores) - np.mean(reference)), "judge_same_distribution": True}
    ks = stats.ks_2samp(reference, scores).pvalue
    mw = stats.mannwhitneyu(reference, scores, alternative="two-sided").pvalue
    diff = float(np.mean(scores) - np.mean(reference))
    return {"judge_ks_p": float(ks), "judge_mw_p": float(mw), "judge_mean_diff": diff,
            "judge_same_distribution": bool(ks >= alpha and mw >= alpha)}


def acceptance_grid(records: list[list[int]], grid: tuple[int, int]) -> np.ndarray:
    """Mean 'committed as an accepted draft' per layout position. -> [rows, cols]"""
    rows, cols = grid
    total = np.zeros(rows * cols)
    for lengths in records:
        flags = [0.0]  # the first token comes from the prefill
        for chunk in lengths:
            flags += [1.0] * (chunk - 1) + [0.0]
        total[: min(len(flags), rows * cols)] += np.array(flags[: rows * cols])
    return (total / max(1, len(records))).reshape(rows, cols)


def plots(records: dict[str, MethodRecord], grid: tuple[int, int], out_dir: Path) -> list[Path]:
    """PNGs in ``out_dir``: the drafted methods' tokens committed per forward (a histogram) and
    their accepted-draft share per image position (a heatmap each) -> their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    drafted = [m for m in records if m not in ("ar", "hf")]
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for method in drafted:
        lengths = [c for image in records[method].accepted_lengths for c in image]
        if lengths:
            ax.hist(lengths, bins=range(1, max(lengths) + 2), alpha=0.5, label=method, density=True)
    ax.set_xlabel("tokens committed per target forward")
    ax.set_ylabel("share of forwards")
    ax.legend()
    paths.append(out_dir / "t2i_accept_hist.png")
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    if drafted:
        fig, axes = plt.subplots(1, len(drafted), figsize=(4 * len(drafted), 4))
        for ax, method in zip(np.atleast_1d(axes), drafted):
            image = ax.imshow(acceptance_grid(records[method].accepted_lengths, grid), vmin=0, vmax=1, cmap="viridis")
            ax.set_title(f"{method}: accepted draft share")
            ax.axis("off")
        fig.colorbar(image, ax=list(np.atleast_1d(axes)))
        paths.append(out_dir / "t2i_accept_heatmap.png")
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    return paths
