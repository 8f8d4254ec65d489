"""The open-loop load of `raydec bench serve --rates R1,R2,...`: requests arrive at a rate (Poisson:
exponential gaps from a seeded generator), each fired as its own task at its arrival time, so an
arrival never waits on an earlier request (unlike the closed loop, where C clients each wait for
their last answer). What vLLM's benchmark_serving measures: completed requests per second, end-to-end
latency percentiles, and for streams the time to first token and the gap between stream events.

A rate's run sends at most ``count`` requests, and none after ``seconds``; requests still running
then are awaited up to ``drain_s`` more, and counted as errors if they have not finished.
This module holds the load, its summary, the table and the plot; ``raydec.bench.serve`` starts
the app, measures the in-process rate and interleaves the served models rate by rate.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from raydec.bench.common import print_table


def positive_float_list(text: str) -> list[float]:
    """An argparse ``type`` for ``--rates``: comma-separated numbers > 0 (requests per second)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0 (requests per second), got {text!r}")
    return values


def percentile(values: list[float], q: float) -> Optional[float]:
    """The ``q`` quantile of ``values`` (the nearest rank; None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def arrival_times(rate: float, count: int, seed: str) -> list[float]:
    """``count`` Poisson arrival times in seconds from the start (the first at 0): exponential gaps
    of mean 1 / ``rate`` from a generator seeded with ``seed`` (the same schedule for every model)."""
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times


@dataclass
class Load:
    """What one rate's run against one model recorded."""

    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    seconds: float = 0.0


@dataclass
class Target:
    """Where and what to send: the app's base URL and key, the task, the served model and an optional
    per-request method, with the prompts (images) or image data URLs (chat) requests cycle through."""

    url: str
    key: Optional[str]
    task: str
    model: str
    method: Optional[str]
    prompts: list[str]
    image_urls: list[str]
    long_share: float = 0.0  # the share of requests whose text is ``long_repeat`` times their own (long prompts)
    long_repeat: int = 1

    def text(self, number: int, base: str) -> str:
        """Request ``number``'s text: ``base``, or ``base`` ``long_repeat`` times over for the requests the long share picks
        (every request whose ``number`` times the golden ratio falls, modulo 1, below the share: spread evenly)."""
        long = (number * 0.6180339887498949) % 1.0 < self.long_share
        return " ".join([base] * self.long_repeat) if long else base


async def _one(client: Any, target: Target, number: int, load: Load) -> None:
    """One request, timed from its send; a failure is recorded, not raised."""
    extra = {"method": target.method} if target.method else {}
    started = time.perf_counter()
    try:
        if target.task == "images":
            prompt = target.text(number, target.prompts[number % len(target.prompts)])
            await client.images.generate(prompt=prompt, model=target.model, extra_body={"seed": number, **extra})
        else:
            image_url = target.image_urls[number % len(target.image_urls)]
            stream = await client.chat.completions.create(
                model=target.model, seed=number, stream=True, extra_body=extra,
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                       {"type": "text", "text": target.text(number, "describe the image .")}]}])
            last = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    now = time.perf_counter()
                    if last is None:
                        load.ttfts.append(now - started)
                    else:
                        load.gaps.append(now - last)
                    last = now
            if last is None:  # an empty answer: its first token is its end
                load.ttfts.append(time.perf_counter() - started)
        load.latencies.append(time.perf_counter() - started)
    except Exception as error:  # counted, not raised: the bench reports errors
        load.errors.append(f"{type(error).__name__}: {str(error)[:200]}")


async def open_loop(target: Target, rate: float, count: int, seconds: float, seed: str, drain_s: float) -> Load:
    """Fire up to ``count`` requests at Poisson arrivals of ``rate`` per second for at most ``seconds``,
    then await those in flight for up to ``drain_s``; those still running are cancelled and counted as errors."""
    from openai import AsyncOpenAI  # lazy: the client loads only for the serve bench

    client = AsyncOpenAI(base_url=target.url + "/v1", api_key=target.key or "none", max_retries=0, timeout=600)
    load, tasks = Load(), []
    started = time.perf_counter()
    try:
        for number, at in enumerate(arrival_times(rate, count, seed)):
            if at >= seconds:  # time is up: later arrivals are not sent
                break
            delay = started + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(client, target, number, load)))
        load.sent = len(tasks)
        _, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        load.errors.extend(f"timeout: still running {drain_s:g} s after the last send" for _ in pending)
        load.seconds = time.perf_counter() - started
    finally:
        await client.close()
    return load


def summarise(target: Target, rate: float, load: Load, before: dict, after: dict, in_process: Optional[float]) -> dict[str, Any]:
    """One JSON row: the load's figures with the model's plan and the engine's counters between
    ``before`` and ``after`` (its ``/v1/raydec/stats``)."""
    steps = after["decode_steps"] - before["decode_steps"]
    forwards = after.get("target_forwards", 0) - before.get("target_forwards", 0)
    done = len(load.latencies)
    rate_done = done / load.seconds if load.seconds > 0 else 0.0
    plan = after.get("plan") or {}
    live = after.get("live_plan")  # a replica that follows its live batch: decode steps per plan during this load
    steps_per_plan = None
    if live is not None:
        earlier = (before.get("live_plan") or {}).get("steps_per_plan", {})
        steps_per_plan = {label: count - earlier.get(label, 0) for label, count in live["steps_per_plan"].items()
                          if count > earlier.get(label, 0)}
    return {
        "task": target.task, "model": target.model, "long_prompts": target.long_share, "long_repeat": target.long_repeat,
        "plan": plan.get("label"), "follows_batch": live is not None,
        "steps_per_plan": steps_per_plan, "method": after.get("method"),
        "batch_size": after.get("batch_size"), "rate": rate, "seconds": load.seconds,
        "sent": load.sent, "completed": done, "errors": len(load.errors), "error_samples": load.errors[:5],
        "completed_per_s": rate_done,
        "p50_s": percentile(load.latencies, 0.5), "p90_s": percentile(load.latencies, 0.9), "p99_s": percentile(load.latencies, 0.99),
        "mean_s": statistics.fmean(load.latencies) if load.latencies else None,
        "ttft_p50_s": percentile(load.ttfts, 0.5), "ttft_p99_s": percentile(load.ttfts, 0.99),
        "gap_p50_s": percentile(load.gaps, 0.5), "gap_p99_s": percentile(load.gaps, 0.99),
        "mean_batch": (after["rows_stepped"] - before["rows_stepped"]) / steps if steps else None,
        **step_figures(before, after, steps, load.seconds),
        "tokens_per_forward": (after.get("output_tokens", 0) - before.get("output_tokens", 0)) / forwards if forwards else None,
        "in_process_rate": in_process,
        "load_share": rate_done / in_process if in_process else None,
    }


def step_figures(before: dict, after: dict, steps: int, seconds: float | None = None) -> dict[str, Any]:
    """The engine's decode steps during a load (admissions included): their duration's p50 and p99; a decoding
    row's step time (from one of its decode steps to the next, admissions between them included): its p50, p99
    and their ratio; the share of the engine thread's time in steps against the host work between back-to-back steps;
    given the load's ``seconds``, where its wall time went: ``engine_busy`` (in steps), ``engine_cpu`` and
    ``replica_cpu`` (CPU seconds of the engine's and the replica's processes, per second of wall)."""
    recent = (after.get("step_times_s") or [])[-steps:] if steps > 0 else []
    intervals = after.get("row_step_times_s") or []
    intervals = intervals[len(intervals) - min(len(intervals), steps):] if steps > 0 else []  # at most one per decode step of the load
    row_p50, row_p99 = percentile(intervals, 0.5), percentile(intervals, 0.99)
    in_steps = after.get("step_seconds", 0.0) - before.get("step_seconds", 0.0)
    between = after.get("between_steps_seconds", 0.0) - before.get("between_steps_seconds", 0.0)
    figures: dict[str, Any] = {"step_p50_s": percentile(recent, 0.5), "step_p99_s": percentile(recent, 0.99), "step_count": len(recent),
                               "row_step_p50_s": row_p50, "row_step_p99_s": row_p99,
                               "row_step_p99_over_p50": row_p99 / row_p50 if row_p50 and row_p99 is not None else None,
                               "engine_step_share": in_steps / (in_steps + between) if in_steps + between > 0 else None}
    if seconds:
        def per_second(key: str) -> Optional[float]:
            return (after[key] - before[key]) / seconds if key in after and key in before else None

        figures.update(engine_busy=in_steps / seconds, engine_cpu=per_second("engine_cpu_s"), replica_cpu=per_second("replica_cpu_s"))
    return figures


def _fmt(value: Optional[float], spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def _plan(row: dict) -> str:
    """A row's plan in words: its one plan's label, or the plans a replica that follows its batch decoded with."""
    if not row.get("follows_batch"):
        return str(row["plan"])
    steps = row.get("steps_per_plan") or {}
    return "follows the batch: " + (", ".join(f"{label} {count} steps" for label, count in steps.items()) or "no step")


def print_rows(result: dict) -> None:
    """The open-loop table: one line per (model, rate)."""
    unit = "images" if result["task"] == "images" else "answers"
    header = ["model (plan)", "rate/s", f"{unit}/s", "p50 s", "p90 s", "p99 s", "ttft p50 s", "gap p50 s", "mean batch",
              "row step p50 ms", "row step p99 ms", "in process/s", "load share", "sent", "errors"]
    rows = [[f"{r['model']} ({_plan(r)})", _fmt(r["rate"], "g"), _fmt(r["completed_per_s"]), _fmt(r["p50_s"]), _fmt(r["p90_s"]),
             _fmt(r["p99_s"]), _fmt(r["ttft_p50_s"]), _fmt(r["gap_p50_s"], ".4f"), _fmt(r["mean_batch"], ".2f"),
             _ms(r.get("row_step_p50_s")), _ms(r.get("row_step_p99_s")),
             _fmt(r["in_process_rate"]), _fmt(r["load_share"], ".2f"), str(r["sent"]), str(r["errors"])]
            for r in result["rows"]]
    print_table(f"raydec bench serve: {result['task']}, open loop (Poisson arrivals, seed {result['seed']}), up to "
                f"{result['requests']} requests or {result['seconds']:g} s per rate", header, rows)
    print("load share = completed/s over the in-process rows/s at the model's batch (the share of its capacity the load used)")


def plot(result: dict, out_dir: Path) -> Path:
    """p50 latency (solid) and p99 (dashed) against the offered rate, one colour per served model."""
    import matplotlib  # lazy: plotting only with --plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for index, model in enumerate(result["models"]):
        rows = sorted((r for r in result["rows"] if r["model"] == model), key=lambda r: r["rate"])
        color = f"C{index}"
        points = [(r["rate"], r["p50_s"], r["p99_s"]) for r in rows if r["p50_s"] is not None]
        label = f"{model} ({'follows the batch' if rows[0].get('follows_batch') else rows[0]['plan']})" if rows else model
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=color, label=f"{label} p50")
        ax.plot([p[0] for p in points], [p[2] for p in points], marker="x", color=color, linestyle="--", label=f"{label} p99")
    ax.set_xlabel("offered rate (requests per second)")
    ax.set_ylabel("end-to-end latency (s)")
    ax.set_title(f"raydec bench serve: {result['task']}, open loop")
    ax.legend(fontsize="small")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"serve_open_loop_{result['task']}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
