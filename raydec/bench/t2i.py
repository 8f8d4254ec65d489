"""`raydec bench t2i`: AR, Hugging Face's own Janus generate, SJD, SJD+AC and SJD-PAC side by side.

Same prompts and seeds for every method; methods interleaved batch by batch in one run, so
machine noise hits all alike. Per method: step compression vs AR (AR forwards / method
forwards, per image, then mean), latency speedup vs AR and vs `hf` (total time ratios), mean
committed tokens per forward, and the judge score. Also measures what one forward of the
draft window costs relative to a one-token forward, which is what separates step compression
from latency speedup on a given machine.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raydec.api import continuous_batching, generate_images, load_target
from raydec.bench.common import (
    folder_path_arg, json_path_arg, non_negative_int, parse_methods, positive_int, positive_float, print_table, resolve_device,
)
from raydec.bench.cost_tuner import (
    DEFAULT_WINDOWS, candidate_shapes, choose_fresh_drafts, forward_seconds, probe_shape, relative_costs, tune_draft, window_cost,
)
from raydec.bench.t2i_report import MethodRecord, plots, print_tuning, summary_table, t2i_summary, tuning_json
from raydec.bench.t2i_report import score_agreement as score_agreement  # re-exported from this module, its earlier home
from raydec.config import JACOBI_METHODS, DecodeConfig, JacobiDraftConfig
from raydec.models.base import decoding_attention, synchronize
from raydec.models.registry import T2I_LOADERS, checkpoint_model_type, resolve_t2i_path
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

logger = logging.getLogger(__name__)

ALL_METHODS = ("ar", "hf") + JACOBI_METHODS
TUNE_OFFSET = 500_000  # calibration prompts: held-out seeds far from any benchmark's


def fixed_draft(method: str, args: argparse.Namespace, init: str = "uniform") -> JacobiDraftConfig:
    """The draft shape from the CLI (``--window N``, ``--branching``, ``--tree-depth``)."""
    tree = dict(branching=args.branching, tree_depth=args.tree_depth) if method == "sjd_pac" else {}
    return JacobiDraftConfig(window=int(args.window), init=init, **tree)


def _check_fixed_drafts(methods: list[str], args: argparse.Namespace) -> None:
    """A fixed ``--window`` must hold each method's draft; say so before any model loads."""
    from pydantic import ValidationError

    if args.window == "auto":
        return
    for method in methods:
        if method in JACOBI_METHODS:
            try:
                fixed_draft(method, args, "uniform" if args.init == "auto" else args.init)
            except ValidationError as exc:
                raise SystemExit(
                    f"--window {args.window} --branching {args.branching} --tree-depth {args.tree_depth}: no valid {method} "
                    f"draft ({exc.errors()[0]['msg']}); widen --window or lower --branching / --tree-depth"
                ) from None


def method_config(method: str, args: argparse.Namespace, sampling: Any, length: int) -> DecodeConfig:
    """The decode config of one method with a fixed draft shape and prior from the CLI."""
    if method == "ar":
        return DecodeConfig(method="ar", max_new_tokens=length, sampling=sampling, batching=args.batching)
    jacobi = fixed_draft(method, args, args.init)
    return DecodeConfig(method=method, max_new_tokens=length, sampling=sampling, jacobi=jacobi, batching=args.batching)


def tuned_configs(target: Any, methods: list[str], args: argparse.Namespace, sampling: Any, length: int) -> tuple[dict, list, list]:
    """``--init auto`` / ``--window auto``: each Jacobi method's fresh-draft prior chosen by
    :func:`choose_fresh_drafts`, then its draft shape by :func:`tune_draft`, on ``--tune-prompts``
    calibration prompts (held-out seeds far from the benchmark's).
    -> (configs, shapes tried, [(method, probe shape, forwards per image of each prior, chosen)])"""
    jacobi = [m for m in methods if m in JACOBI_METHODS]
    tuned = [what for what, auto in (("draft shapes", args.window == "auto"), ("fresh-draft priors", args.init == "auto")) if auto]
    logger.info("bench t2i: tuning %s on %d calibration prompts first (%s); a fixed --window, --branching, --tree-depth "
                "and --init skip this", ", ".join(jacobi), args.tune_prompts, " and ".join(tuned))
    prompts = [make_sample(HELD_OUT_SEED_START + TUNE_OFFSET + i).prompt for i in range(args.tune_prompts)]
    seeds = [args.seed + TUNE_OFFSET + i for i in range(args.tune_prompts)]
    windows = args.tune_windows or DEFAULT_WINDOWS
    tune_shape = args.window == "auto"
    if tune_shape:
        sizes = sorted({1} | {s.window + 1 for m in jacobi for s in candidate_shapes(m, windows)})
        seconds = forward_seconds(target, prompts[0], sizes, batch=args.batch)
        costs = relative_costs(seconds)
    configs, tried, priors = {}, [], []
    def choose_prior(method: str, probe: Any) -> str:
        known = next((chosen for m, p, _, chosen in priors if m == method and p == probe), None)
        if known is not None:  # the same prompts and seeds count the same forwards
            return known
        init, steps = choose_fresh_drafts(target, method, probe, prompts, seeds, sampling, args.batch, batching=args.batching)
        priors.append((method, probe, steps, init))
        return init

    for method in jacobi:
        init = chain_init = args.init
        if init == "auto":
            init = choose_prior(method, probe_shape(method, windows) if tune_shape else fixed_draft(method, args))
            # SJD-PAC's chains (SJD-AC's shapes) take the prior SJD-AC's would
            chain_init = choose_prior("sjd_ac", probe_shape("sjd_ac", windows)) if method == "sjd_pac" and tune_shape else init
        if tune_shape:
            best, shapes = tune_draft(
                target, method, prompts, seeds, sampling, args.batch, windows=windows,
                costs=costs, one_token_seconds=seconds[1], inits=(init,), batching=args.batching, chain_init=chain_init,
            )
            shape, tried = best.jacobi, tried + shapes
        else:
            shape = fixed_draft(method, args, init)
        configs[method] = DecodeConfig(method=method, max_new_tokens=length, sampling=sampling, jacobi=shape, batching=args.batching)
    return configs, tried, priors


def _check_before_loading(methods: list[str], args: argparse.Namespace) -> None:
    """Options that cannot run, refused before any model loads."""
    if args.seed + args.prompts > 2**63:
        raise SystemExit(f"--seed {args.seed}: prompts take seeds {args.seed}..{args.seed + args.prompts - 1}, past 2**63 - 1")
    if args.window == "auto" and "sjd_pac" in methods:
        try:
            candidate_shapes("sjd_pac", args.tune_windows or DEFAULT_WINDOWS)
        except ValueError as exc:
            raise SystemExit(f"--tune-windows: {exc}") from None
    if "hf" in methods:
        try:
            model_type = checkpoint_model_type(resolve_t2i_path(args.model))
        except (FileNotFoundError, ValueError):
            return  # the load reports a missing or unreadable model
        if model_type not in T2I_LOADERS:
            return  # the load reports a checkpoint that is no text-to-image model
        if model_type != "janus":
            raise SystemExit(
                f"--methods hf: Hugging Face's image generation baseline (generate(generation_mode='image')) runs on "
                f"Janus checkpoints; {args.model} is a {model_type!r} checkpoint (leave hf out of --methods)"
            )


def _check_calibration_apart(args: argparse.Namespace) -> None:
    """With ``--window auto`` or ``--init auto`` the measured prompts must not overlap the tuner's
    calibration prompts (held-out indices from ``TUNE_OFFSET``)."""
    calibration = args.tune_prompts or max(4, 2 * args.batch)
    if (args.window == "auto" or args.init == "auto") and args.offset < TUNE_OFFSET + calibration and TUNE_OFFSET < args.offset + args.prompts:
        raise SystemExit(
            f"--offset {args.offset} --prompts {args.prompts}: the measured prompts would overlap the tuner's calibration "
            f"prompts (held-out indices {TUNE_OFFSET}..{TUNE_OFFSET + calibration - 1}); measure elsewhere"
        )


def _hf_generate(target: Any, prompts: list[str], seed: int, sampling: Any) -> tuple[list[list[int]], float]:
    """Hugging Face's own Janus image generation on the same checkpoint."""
    processor = target.processor
    inputs = processor(text=list(prompts), generation_mode="image", padding=True, return_tensors="pt").to(target.device)
    torch.manual_seed(seed)
    synchronize(target.device)
    start = time.perf_counter()
    with torch.inference_mode(), decoding_attention(target.device):  # the kernels our engine uses
        out = target.model.generate(
            input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, generation_mode="image",
            do_sample=sampling.temperature > 0, temperature=sampling.temperature or None,
            top_k=sampling.top_k or None, top_p=sampling.top_p, guidance_scale=sampling.cfg_scale,
        )
    return out.tolist(), time.perf_counter() - start


def _hf_chunk(target: Any, prompts: list[str], seeds: list[int], batch: int, sampling: Any, device: str) -> tuple[list[list[int]], Any, float]:
    """Hugging Face's generate over ``prompts`` in consecutive batches of ``batch`` (each seeded with
    its first prompt's seed), then the pixels -> tokens per image, images, seconds (pixels included,
    as they are inside ``generate_images``)."""
    tokens, seconds = [], 0.0
    for sub in range(0, len(prompts), batch):
        sub_tokens, sub_seconds = _hf_generate(target, prompts[sub : sub + batch], seeds[sub], sampling)
        tokens += sub_tokens
        seconds += sub_seconds
    begin = time.perf_counter()  # pixels count for hf as they do inside generate_images
    images = target.decode_tokens(torch.tensor(tokens))
    synchronize(device)
    seconds += time.perf_counter() - begin
    return tokens, images, seconds


def bench_t2i(args: argparse.Namespace) -> dict:
    from raydec.reference.judge import score_image  # lazy: keeps raydec bench --help light

    if args.threads:
        torch.set_num_threads(args.threads)
    methods = parse_methods(args.methods, ALL_METHODS)
    _check_fixed_drafts(methods, args)
    _check_before_loading(methods, args)
    _check_calibration_apart(args)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    device = resolve_device(args.device)
    target = load_target(args.model, "t2i", dtype=dtype, device=None if device == "cpu" else device)
    sampling = target.default_sampling()
    length = int(target.num_image_tokens)
    prompts = [make_sample(HELD_OUT_SEED_START + args.offset + i).prompt for i in range(args.prompts)]
    seeds = [args.seed + i for i in range(args.prompts)]
    configs = {}
    for method in methods:
        if method == "ar" or (method != "hf" and args.window != "auto" and args.init != "auto"):
            configs[method] = method_config(method, args, sampling, length)
    tried, priors = [], []
    if args.window == "auto" or args.init == "auto":
        args.tune_prompts = args.tune_prompts or max(4, 2 * args.batch)  # two batches: one slow row decides less
        tuned, tried, priors = tuned_configs(target, methods, args, sampling, length)
        configs.update(tuned)
    print_tuning(priors, tried, args.batch, args.tune_prompts)
    records = {m: MethodRecord() for m in methods}

    generate_images(prompts[:1], model=target, decode=configs["ar"], seeds=seeds[:1])  # warm-up
    loop_start, measured = time.perf_counter(), 0
    chunk = args.chunk or (1 if args.batch == 1 else 4 * args.batch)
    for start in range(0, len(prompts), chunk):
        if args.max_seconds and measured and time.perf_counter() - loop_start >= args.max_seconds:
            logger.warning("bench t2i: --max-seconds %g reached, stopping after %d of %d prompts", args.max_seconds, measured, len(prompts))
            break
        batch_prompts, batch_seeds = prompts[start : start + chunk], seeds[start : start + chunk]
        measured += len(batch_prompts)
        for method in methods:
            record = records[method]
            if method == "hf":  # Hugging Face batches statically: consecutive batches of --batch
                tokens, images, seconds = _hf_chunk(target, batch_prompts, batch_seeds, args.batch, sampling, device)
                record.forwards += [len(t) for t in tokens]
                record.tokens += [len(t) for t in tokens]
            else:  # up to --batch rows at once (--batching: continuous on a GPU by default)
                synchronize(device)
                begin = time.perf_counter()
                results = generate_images(batch_prompts, model=target, decode=configs[method], seeds=batch_seeds, batch_size=args.batch)
                seconds = time.perf_counter() - begin
                images = [r.image for r in results]
                record.forwards += [r.target_forwards for r in results]
                record.tokens += [r.num_tokens for r in results]
                record.accepted_lengths += [_chunks(r) for r in results]
            record.seconds += seconds
            record.scores += [score_image(np.asarray(img), p) for img, p in zip(images, batch_prompts)]
        logger.info("bench t2i: %d/%d prompts", min(start + chunk, len(prompts)), len(prompts))

    summary = t2i_summary(records)
    windows = {c.jacobi.window + 1 for c in configs.values() if c.method != "ar"}
    cost = window_cost(target, prompts[0], sorted({1, 16, 64} | windows), batch=args.batch)
    pictures = plots(records, target.layout_grid, args.plots)
    batching = "continuous" if continuous_batching(device, args.batching) else "consecutive"
    print_table(f"bench t2i: {args.model}, {measured} prompts, batch {args.batch} ({batching}), {args.dtype}, {device}",
                *summary_table(summary))
    print("drafts: " + ", ".join(
        f"{m} window {c.jacobi.window}" + (f" K {c.jacobi.branching} D-1 {c.jacobi.tree_depth}" if c.jacobi.tree_depth else "") + f" ({c.jacobi.init})"
        for m, c in configs.items() if c.method != "ar"
    ))
    print("forward cost relative to a 1-token forward: " + ", ".join(f"{n} tokens {c:.2f}x" for n, c in cost.items()))
    return {
        "methods": summary,
        "window_cost": {str(n): c for n, c in cost.items()},
        "config": {m: c.model_dump() for m, c in configs.items()},
        **tuning_json(priors, tried),
        "prompts": measured, "prompts_requested": args.prompts, "batch": args.batch, "batching": batching, "chunk": chunk, "dtype": args.dtype, "device": device,
        "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu", "model": str(args.model),
        "plots": [str(p) for p in pictures],
    }


def _chunks(result: Any) -> list[int]:
    """Tokens committed per decode forward, recovered from the result's statistics."""
    return list(getattr(result, "accepted_lengths", []) or [])


def _window_arg(value: str) -> str | int:
    if value == "auto":
        return value
    try:
        window = int(value)
    except ValueError:
        window = 0
    if window < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value!r}")
    return window


def _windows_arg(value: str) -> tuple[int, ...]:
    try:
        windows = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        windows = ()
    if not windows or min(windows) < 1:
        raise argparse.ArgumentTypeError(f"--tune-windows: expected comma-separated positive integers, got {value!r}")
    return windows


def add_t2i_parser(subparsers) -> None:
    parser = subparsers.add_parser("t2i", help="AR / HF / SJD / SJD+AC / SJD-PAC on a text-to-image model")
    parser.add_argument("--model", default="reference", help='"reference" or a local Janus / Emu3 checkpoint folder (hf: Janus only)')
    parser.add_argument("--methods", default=",".join(ALL_METHODS), help="comma-separated subset of " + ",".join(ALL_METHODS))
    parser.add_argument("--prompts", type=positive_int, default=200, help="held-out shapes prompts")
    parser.add_argument("--offset", type=non_negative_int, default=0, help="first held-out prompt index")
    parser.add_argument(
        "--max-seconds", type=positive_float, default=None,
        help="stop taking new prompts once the measured loop (after tuning) has run this long; every method "
        "finishes the batch it is on, so all methods see the same prompts",
    )
    parser.add_argument("--batch", type=positive_int, default=1, help="rows decoding together")
    parser.add_argument(
        "--chunk", type=positive_int, default=None,
        help="prompts per generate_images call; methods interleave chunk by chunk. Under continuous batching a "
        "finished row's place goes to the chunk's next prompt; consecutive batches drain to their slowest row "
        "(default: 1 at --batch 1, else 4 x --batch)",
    )
    parser.add_argument(
        "--batching", choices=["auto", "continuous", "consecutive"], default="auto",
        help="DecodeConfig.batching of every engine method (and of the tuner's calibration): auto is continuous "
        "on a GPU and consecutive on a CPU; 'consecutive' on a GPU measures the draining-batch baseline",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (cuda when torch sees a GPU)")
    parser.add_argument(
        "--window", type=_window_arg, default="auto",
        help="draft nodes per step (L - 1), or 'auto': tune window and tree per method from the measured cost curve "
             "(minutes on a CPU, whatever --prompts is; a fixed --window with --branching, --tree-depth and --init skips it)",
    )
    parser.add_argument(
        "--tune-prompts", type=positive_int, default=None,
        help="--init / --window auto: calibration prompts (default: max(4, 2 x --batch))",
    )
    parser.add_argument(
        "--tune-windows", type=_windows_arg, default=None,
        help="--window auto: comma-separated windows to try (default 8,16,32,48; on a GPU, where a wide window "
        "costs about as much as a narrow one, add larger ones such as 64,96)",
    )
    parser.add_argument("--branching", type=positive_int, default=3, help="sjd_pac with a fixed --window: candidates per level (K)")
    parser.add_argument("--tree-depth", type=non_negative_int, default=2, help="sjd_pac with a fixed --window: tree levels (D - 1)")
    parser.add_argument(
        "--init", choices=["auto", "uniform", "left", "above"], default="auto",
        help="fresh drafts (slots never predicted): uniform over image ids, a copy of the token to the left / above, "
        "or 'auto': per method, the one needing the fewest forwards on the calibration prompts",
    )
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--plots", type=folder_path_arg, default=Path("bench_out"), help="folder for the PNG plots")
    parser.add_argument("--json", type=json_path_arg, default=None)
    parser.set_defaults(bench=bench_t2i)
