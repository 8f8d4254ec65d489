"""`raydec bench throughput`: items per second against batch size, and the frontier.

    raydec bench throughput --task t2i --batches 1,8,32                    # reference Janus: ar, sjd_pac
    raydec bench throughput --task caption --batches 1,8,32                # reference VLM: ar, vispec
    raydec bench throughput --task t2i --batches 1,8,32 --memory-budget 2e8

A batch user compares speculation with plain AR at AR's best batch, not at ours. For every
batch size this bench first tunes each speculative method's shape for that batch
(``raydec.api.tuner.tune_for_batch`` on calibration rows, plain AR among the candidates), then
decodes the measured rows with AR and with every candidate shape (``--shapes tuned``: with each
method's tuned one only) (``--repeats`` runs of each, each
on rows of its own, the same rows for every config) and reports per (method, shape, batch). The
configs take turns one batch of rows at a time, the order rotated each time, so that a slow spell of
the machine (its speed can drift by a fifth within a minute) falls on every config alike; the
tuner's rounds take turns the same way. Continuous batching decodes each repeat's rows as one queue.

    items_per_s        rows finished per second
    tokens_per_forward generated tokens per target forward
    kv_bytes           the most bytes the batch's KV cache held (CFG rows, draft windows and
                       holes included): the memory the batch needs
    occupancy          mean share of the batch decoding while rows waited (continuous batching)
    auto               true on the row of the shape the tuner chose for that batch (a method's
                       ``auto`` may be plain AR)

and the headline, ``frontier_ratio``: the best speculative items/s over the best AR items/s,
each maximised over the batch sizes whose KV fits ``--memory-budget`` (default: every batch
run). Table on stdout, JSON (``--json``: ``rows``, ``frontier_ratio``, ``frontier``) and a plot
of items/s against batch, one line per method (``--plots``).
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from raydec.api.inputs import caption_decode_config, image_decode_config, max_positions
from raydec.bench.common import (
    folder_path_arg, json_path_arg, non_negative_int, parse_methods, positive_float, positive_int, positive_int_list, print_table,
    resolve_device,
)
from raydec.api import continuous_batching, draft_dtype, load_target
from raydec.api.draft_shapes import candidate_configs
from raydec.api.plan import plan_decode
from raydec.api.tuner import shape_label
from raydec.config import DRAFT_METHODS, JACOBI_METHODS, DecodeConfig, JacobiDraftConfig
from raydec.models.base import synchronize
from raydec.models.image_gen import ImagePrompt
from raydec.models.loading import load_draft_model
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil
from raydec.speculative.capture import resolve_compile
from raydec.speculative.engine import Engine
from raydec.speculative.proposers.factory import make_proposer
from raydec.speculative.requests import COUPLINGS, RowRequest

logger = logging.getLogger(__name__)

TASK_METHODS = {"t2i": ("ar", "sjd", "sjd_ac", "sjd_pac"), "caption": ("ar", "vispec", "eagle")}
DEFAULT_METHODS = {"t2i": "ar,sjd_pac", "caption": "ar,vispec"}
DEFAULT_ITEMS = {"t2i": 16, "caption": 128}  # measured rows per (shape, batch): a caption takes a fraction of an image's time
DEFAULT_CALIBRATION = {"t2i": 8, "caption": 32}
CALIBRATION_OFFSET = 50_000  # calibration rows come from seeds far from the measured ones
# a batch lasts as long as its slowest row, and how far a draft gets depends on the row: the rows
# a shape is timed on are several batches, so one hard row does not decide
MIN_BATCHES = 4  # measured rows per (shape, batch, repeat): this many batches at least
CALIBRATION_BATCHES = 2  # calibration rows at hand: this many batches at least (a tuning round takes round_size(batch) of them)


@dataclass
class Workload:
    """One task's target, its decode config per method, and how to build its engines and rows."""

    target: Any
    base: dict[str, Any]  # method -> DecodeConfig (the method's own defaults)
    engine: Callable[[Any], Any]  # DecodeConfig -> Engine
    requests: Callable[[Any, int, int], list]  # (config, first, count) -> RowRequests


@dataclass
class Measured:
    seconds: float
    tokens: int
    forwards: int
    kv_bytes: int
    occupancy: float | None


def _t2i_workload(args: argparse.Namespace, dtype: torch.dtype, device: str) -> Workload:
    target = load_target(args.model, task="t2i", dtype=dtype, device=None if device == "cpu" else device)
    base = {m: image_decode_config(DecodeConfig(method=m, batching=args.batching, jacobi=JacobiDraftConfig(init=args.init)), target)
            for m in args.methods}

    def engine(config: Any) -> Any:
        return Engine(target, make_proposer(config, target), config.sampling, config.max_new_tokens, compaction=config.compaction, compile=config.compile, coupling=config.coupling, constraint=target.vocab_constraint(), eos_token_ids=target.eos_token_ids)

    def requests(config: Any, first: int, count: int) -> list:
        return [RowRequest(ImagePrompt(make_sample(HELD_OUT_SEED_START + first + i).prompt, None), seed=args.seed + first + i,
                           max_new_tokens=config.max_new_tokens) for i in range(count)]

    return Workload(target, base, engine, requests)


def _caption_workload(args: argparse.Namespace, dtype: torch.dtype, device: str) -> Workload:
    from raydec.models.hf_vlm import VlmPrompt  # lazy: keeps raydec bench --help light

    target = load_target(args.model, task="caption", dtype=dtype, device=None if device == "cpu" else device)
    base = {m: caption_decode_config(DecodeConfig(method=m, batching=args.batching, max_new_tokens=args.max_new_tokens), target)
            for m in args.methods}
    draft_models = {m: load_draft_model(target, m, args.model, None, dtype=draft_dtype(target, "auto"))
                    for m in args.methods if m in DRAFT_METHODS}

    def engine(config: Any) -> Any:
        draft_model = draft_models.get(config.method)
        return Engine(target, make_proposer(config, target, draft_model), config.sampling, config.max_new_tokens, compaction=config.compaction, compile=config.compile, coupling=config.coupling, eos_token_ids=target.eos_token_ids,
                      max_positions=max_positions(target))

    def requests(config: Any, first: int, count: int) -> list:
        rows = []
        for i in range(count):
            image = to_pil(make_sample(HELD_OUT_SEED_START + first + i).image)
            rows.append(RowRequest(VlmPrompt(target.format_prompt(args.prompt, 1), [image]), seed=args.seed + first + i,
                                   max_new_tokens=config.max_new_tokens))
        return rows

    return Workload(target, base, engine, requests)


def decode_rows(workload: Workload, config: Any, requests: list, batch: int, continuous: bool) -> Measured:
    """Decode ``requests`` at ``batch`` (continuously batched, or in consecutive batches) and measure."""
    engine = workload.engine(config)
    groups = [requests] if continuous else [requests[i : i + batch] for i in range(0, len(requests), batch)]
    tokens = forwards = kv_bytes = 0
    occupancy = None
    synchronize(workload.target.device)
    start = time.perf_counter()
    for group in groups:
        session = engine.session(batch_size=batch)
        handles = [session.submit(r) for r in group]
        while session.busy:
            session.step()
            if session.cache is not None:
                kv_bytes = max(kv_bytes, session.cache.nbytes())
        for handle in handles:
            out = session.output(handle)
            tokens += len(out.tokens)
            forwards += out.stats.target_forwards
        if continuous:
            occupancy = session.occupancy
    synchronize(workload.target.device)
    return Measured(time.perf_counter() - start, tokens, forwards, kv_bytes, occupancy)


def frontier(rows: list[dict], budget: float | None) -> dict:
    """Best AR and best speculative items/s over the batches whose KV fits ``budget`` bytes."""
    fits = [r for r in rows if budget is None or r["kv_bytes"] <= budget]
    ar = [r for r in fits if r["shape"] == "ar" and r["method"] == "ar"]
    spec = [r for r in fits if r["method"] != "ar" and r["auto"]]
    best_ar = max(ar, key=lambda r: r["items_per_s"], default=None)
    best_spec = max(spec, key=lambda r: r["items_per_s"], default=None)
    ratio = best_spec["items_per_s"] / best_ar["items_per_s"] if best_ar and best_spec else None
    def brief(r: dict | None) -> dict | None:
        return None if r is None else {k: r[k] for k in ("method", "batch", "shape", "items_per_s", "kv_bytes")}
    return {"memory_budget": budget, "best_ar": brief(best_ar), "best_speculative": brief(best_spec), "frontier_ratio": ratio}


class BenchCalibration:
    """``plan_decode``'s calibration for the bench: the workload's calibration rows (seeds from
    CALIBRATION_OFFSET), decoded as the measured rows are; no key, so nothing is cached."""

    def __init__(self, workload: Workload, continuous: bool, rows: int, compile_mode: str, device: str) -> None:
        self.workload, self.continuous, self.rows = workload, continuous, rows
        self.captured = resolve_compile(compile_mode, device)

    def available(self, batch: int) -> int:
        return self.rows

    def key(self, decode: Any, batch: int) -> None:
        return None

    def seconds(self, decode: Any, batch: int, rows: list[int]) -> float:
        requests = [self.workload.requests(decode, CALIBRATION_OFFSET + i, 1)[0] for i in rows]
        return decode_rows(self.workload, decode, requests, batch, self.continuous).seconds

    def measure_batch(self) -> dict:
        raise ValueError("bench throughput: --batches names the batch sizes")


def bench_throughput(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    args.methods = parse_methods(args.methods or DEFAULT_METHODS[args.task], TASK_METHODS[args.task])
    args.couplings = _couplings(args.couplings)
    device = resolve_device(args.device)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    workload = (_t2i_workload if args.task == "t2i" else _caption_workload)(args, dtype, device)
    continuous = continuous_batching(device, args.batching)
    rows: list[dict] = []
    tuned: list[dict] = []
    warm = workload.base["ar"]
    decode_rows(workload, warm, workload.requests(warm, 0, 1), 1, continuous)  # warm-up
    for turn, batch in enumerate(args.batches):
        items = max(args.items or DEFAULT_ITEMS[args.task], MIN_BATCHES * batch)
        calibration_rows = max(args.calibration or DEFAULT_CALIBRATION[args.task], CALIBRATION_BATCHES * batch)
        turns = 1 if continuous else items // batch  # a repeat's measured rows, one batch per turn
        items = items // turns * turns
        configs, chosen = _tuned_configs(args, workload, batch, calibration_rows, continuous, device, tuned)
        samples: dict[str, list[Measured]] = {label: [] for label in configs}
        labels, size = list(configs), items // turns
        for repeat in range(args.repeats):  # every config on each of the repeat's turns, the same rows, the order rotated
            for part in range(repeat * turns, (repeat + 1) * turns):
                shift = (turn + part) % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    config = configs[label]
                    samples[label].append(decode_rows(workload, config, workload.requests(config, part * size, size), batch, continuous))
            for label in labels:
                logger.info("bench throughput: batch %d %s: %.2f items/s (repeat %d)", batch, label,
                            items / sum(m.seconds for m in samples[label][-turns:]), repeat + 1)
        measured = {label: _total(runs) for label, runs in samples.items()}
        total = items * args.repeats
        for label, config in configs.items():  # AR's one row is its own choice
            rows.append(_row(config.method, batch, shape_label(config), config.method == "ar", total, measured[label], config.coupling))
        for (method, coupling), label in chosen.items():  # each method's tuned choice, as decoded in this run (it may be AR)
            rows.append(_row(method, batch, label, True, total, measured[_label("ar" if label == "ar" else method, label, coupling)], coupling))
    result = {
        "bench": "throughput", "task": args.task, "model": str(args.model), "device": device, "dtype": args.dtype,
        "threads": torch.get_num_threads(), "batching": "continuous" if continuous else "consecutive",
        "batches": args.batches, "methods": args.methods, "couplings": args.couplings, "rows": rows, "tuning": tuned,
        "frontier": frontier(rows, args.memory_budget),
    }
    result["frontier_ratio"] = result["frontier"]["frontier_ratio"]
    _print(result)
    if args.plots is not None:
        result["plot"] = str(_plot(result, args.plots))
    return result


def _couplings(text: str) -> list[str]:
    """``--couplings``: a non-empty comma-separated list of couplings, each once."""
    couplings = [c.strip() for c in text.split(",") if c.strip()]
    if not couplings or any(c not in COUPLINGS for c in couplings) or len(set(couplings)) < len(couplings):
        raise SystemExit(f"--couplings: {text!r} is not a comma-separated list of distinct {', '.join(COUPLINGS)}")
    return couplings


def _label(method: str, shape: str, coupling: str) -> str:
    return f"{method}:{shape}:{coupling}" if method != "ar" else f"ar:{coupling}"


def _tuned_configs(args: argparse.Namespace, workload: Workload, batch: int, calibration_rows: int, continuous: bool, device: str,
                   tuned: list[dict]) -> tuple[dict[str, Any], dict[tuple[str, str], str]]:
    """The configs one batch measures (label -> config, AR first), each method's shape tuned for the
    batch under each coupling (``plan_decode``), and the tuned choice per (method, coupling). With
    ``--shapes tuned`` each coupling also decodes the shapes the other couplings chose, so every
    tuned shape is measured under every coupling: the couplings compared at the same shape."""
    configs: dict[str, Any] = {}
    chosen: dict[tuple[str, str], str] = {}
    shapes: dict[str, list] = {}  # method -> every coupling's tuned config
    for coupling in args.couplings:
        for method in args.methods:
            base = workload.base[method].model_copy(update={"coupling": coupling})
            if method == "ar":
                configs.setdefault(_label("ar", "ar", coupling), base)
                continue
            candidates = candidate_configs(base)
            calibration = BenchCalibration(workload, continuous, calibration_rows, compile_mode=base.compile, device=device)
            auto = base.model_copy(update={"jacobi" if method in JACOBI_METHODS else "draft_tree": "auto"})
            plan = plan_decode(auto, batch, calibration, rounds=args.rounds, candidates=candidates)  # the product's tuning, never cached
            label = chosen[(method, coupling)] = shape_label(plan.decode)
            best = next((c for c in candidates if shape_label(c) == label), plan.decode)
            for config in candidates if args.shapes == "all" else [candidates[0], best]:
                configs.setdefault(_label(config.method, shape_label(config), coupling), config)
            shapes.setdefault(method, []).append(best)
            tuned.append({"method": method, "coupling": coupling, "batch": batch, "chosen": label,
                          "tune_seconds": plan.shape["seconds"], "trials": plan.shape["trials"]})
            logger.info("bench throughput: batch %d, %s (%s) tuned to %s in %.0f s", batch, method, coupling, label, tuned[-1]["tune_seconds"])
    for coupling in args.couplings:  # each coupling at the shapes the others chose
        for config in (c.model_copy(update={"coupling": coupling}) for tuned_configs in shapes.values() for c in tuned_configs):
            configs.setdefault(_label(config.method, shape_label(config), coupling), config)
    return configs, chosen


def _total(runs: list[Measured]) -> Measured:
    """One config's runs together (each repeat's turns, each turn rows of its own): every measured row once."""
    occupancy = [m.occupancy for m in runs if m.occupancy is not None]
    return Measured(sum(m.seconds for m in runs), sum(m.tokens for m in runs), sum(m.forwards for m in runs),
                    max(m.kv_bytes for m in runs), sum(occupancy) / len(occupancy) if occupancy else None)


def _row(method: str, batch: int, shape: str, auto: bool, items: int, m: Measured, coupling: str) -> dict:
    return {"method": method, "coupling": coupling, "batch": batch, "shape": shape, "auto": auto, "items": items,
            "items_per_s": items / m.seconds, "tokens_per_forward": m.tokens / max(1, m.forwards),
            "kv_bytes": m.kv_bytes, "occupancy": m.occupancy}


def _print(result: dict) -> None:
    best = {}
    for r in result["rows"]:
        best[r["batch"]] = max(best.get(r["batch"], 0.0), r["items_per_s"])
    table = [[r["batch"], r["method"], r["coupling"], r["shape"], "yes" if r["auto"] else "", f"{r['items_per_s']:.2f}",
              f"{r['items_per_s'] / best[r['batch']]:.2f}", f"{r['tokens_per_forward']:.2f}", f"{r['kv_bytes'] / 2**20:.1f}",
              "-" if r["occupancy"] is None else f"{r['occupancy']:.3f}"]
             for r in sorted(result["rows"], key=lambda r: (r["batch"], r["method"] != "ar", r["method"], not r["auto"], r["coupling"],
                                                               -r["items_per_s"]))]
    print_table(f"raydec bench throughput --task {result['task']} ({result['device']}, {result['dtype']}, {result['threads']} thread(s), "
                f"{result['batching']} batching)",
                ["batch", "method", "coupling", "shape", "auto", "items/s", "x best", "tokens/fwd", "KV MiB", "occupancy"], table)
    f = result["frontier"]
    if f["frontier_ratio"] is None:
        print("\nfrontier: needs ar and a speculative method within the memory budget")
        return
    print(f"\nfrontier_ratio {f['frontier_ratio']:.2f}: best speculative {f['best_speculative']['items_per_s']:.2f} items/s "
          f"({f['best_speculative']['method']} {f['best_speculative']['shape']} at batch {f['best_speculative']['batch']}) / "
          f"best AR {f['best_ar']['items_per_s']:.2f} items/s (batch {f['best_ar']['batch']})"
          + (f", KV within {f['memory_budget']:.3g} bytes" if f["memory_budget"] else ""))


def _plot(result: dict, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for coupling in result["couplings"]:
        for method in result["methods"]:
            points = sorted((r["batch"], r["items_per_s"]) for r in result["rows"] if r["method"] == method and r["auto"] and r["coupling"] == coupling)
            name = f"{method} (auto)" if method != "ar" else "ar"
            ax.plot([b for b, _ in points], [v for _, v in points], marker="o", label=name if len(result["couplings"]) == 1 else f"{name}, {coupling}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("items per second")
    ratio = result["frontier_ratio"]
    ax.set_title(f"{result['task']}: frontier ratio {ratio:.2f}" if ratio else result["task"])
    ax.legend()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"throughput_{result['task']}.png"
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def add_throughput_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("throughput", help="items/s against batch size, the shape tuned per batch, and the frontier ratio",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=("t2i", "caption"), default="t2i")
    parser.add_argument("--model", default="reference", help='"reference" or a local checkpoint folder of the task')
    parser.add_argument("--methods", default=None, help="comma-separated, ar included (t2i: ar,sjd,sjd_ac,sjd_pac; caption: ar,vispec,eagle)")
    parser.add_argument("--couplings", default="rejection",
                        help="comma-separated: rejection, gumbel (each method tuned and measured under each, side by side)")
    parser.add_argument("--batches", type=positive_int_list, default=[1, 8, 32], help="batch sizes (comma-separated)")
    parser.add_argument("--items", type=positive_int, default=None,
                        help="measured rows per (shape, batch) and repeat, at least four batches (default: t2i 16, caption 128)")
    parser.add_argument("--calibration", type=positive_int, default=None,
                        help="calibration rows per tuning round, at least two batches; each round its own (default: t2i 8, caption 32)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="tuning rounds (after the first, AR and the leaders; up to two more for a close call)")
    parser.add_argument("--repeats", type=positive_int, default=2,
                        help="measured runs of each (shape, batch), each on rows of its own; items/s counts them all")
    parser.add_argument("--shapes", choices=("all", "tuned"), default="all",
                        help="measured shapes: every candidate of each method, or AR and each method's tuned one (with capture on, "
                             "a GPU's default, the tuned ones compile for the finalists only)")
    parser.add_argument("--memory-budget", type=positive_float, default=None, help="KV bytes a batch may use for the frontier (default: any)")
    parser.add_argument("--init", choices=("uniform", "left", "above"), default="left", help="SJD fresh-draft prior")
    parser.add_argument("--prompt", default="describe the image .", help="caption task: the question")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, help="caption task: tokens per caption at most")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--batching", choices=("auto", "continuous", "consecutive"), default="auto",
                        help="auto: continuous on an accelerator, consecutive batches on a CPU")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--plots", type=folder_path_arg, default=Path("bench_out"), help="folder for the plot")
    parser.add_argument("--json", type=json_path_arg, default=None, help="write results here")
    parser.set_defaults(bench=bench_throughput)
