"""`raydec bench ...`: side-by-side measurements, printed as a table and written as JSON.

Speed figures are ratios against a baseline measured in the same run, methods interleaved
prompt by prompt, so machine noise hits every method alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from raydec.validation import file_in_the_way

logger = logging.getLogger(__name__)


@dataclass
class MethodTimes:
    """Per-method accumulators over the prompts of one benchmark run."""

    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    forwards: list[int] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds)

    @property
    def tokens_per_forward(self) -> float:
        return sum(self.tokens) / max(1, sum(self.forwards))


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A plain fixed-width table on stdout."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(f"\n{title}\n{line}\n{'-' * len(line)}")
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


def count_arg(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (argparse names the option in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


positive_int = count_arg(1)
non_negative_int = count_arg(0)


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0 (a time budget, a CPU share)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def json_path_arg(text: str) -> Path:
    """An argparse ``type`` for ``--json``: checked before a long run, not after it."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; name a file, e.g. {str(path / 'bench.json')!r}")
    blocker = file_in_the_way(path.parent)
    if blocker is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: {str(blocker)!r} is a file, not a folder")
    return path


def folder_path_arg(text: str) -> Path:
    """An argparse ``type`` for an output folder (``--plots``): checked before a long run, not after it."""
    blocker = file_in_the_way(text)
    if blocker is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: {str(blocker)!r} is a file, not a folder")
    return Path(text)


def run_bench(args: argparse.Namespace) -> int:
    """Run the chosen bench; bad option values that only its configs can judge exit with their names."""
    from pydantic import ValidationError

    from raydec.models.base import CheckpointError

    try:
        result = args.bench(args)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"])
            problems.append(f"{exc.title}.{field}: {error['msg']} (got {error.get('input')!r})" if field else f"{exc.title}: {error['msg']}")
        raise SystemExit(f"raydec bench {args.which}: bad option value: {'; '.join(problems)}") from None
    except (FileNotFoundError, CheckpointError) as exc:  # a missing model, or one unfit for this bench
        raise SystemExit(f"raydec bench {args.which}: {exc}") from None
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


def write_json(path: Path | None, result: dict) -> None:
    """A bench result as indented JSON, folders made as needed (paths and other objects as text);
    nothing when ``path`` is None."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))


def parse_methods(text: str, known: tuple[str, ...], baseline: str | None = "ar") -> list[str]:
    """``--methods``: a non-empty comma-separated subset of ``known`` that includes ``baseline``
    (the "ar" every speedup is measured against; None: no baseline needed)."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in known]
    if unknown or not methods:
        what = f"unknown {', '.join(unknown)}" if unknown else "none given"
        raise SystemExit(f"--methods: {what} (choose from {', '.join(known)})")
    repeated = sorted({m for m in methods if methods.count(m) > 1})
    if repeated:  # a repeat would run twice into one record and skew every ratio against it
        raise SystemExit(f"--methods {text!r}: {', '.join(repeated)} named more than once")
    if baseline is not None and baseline not in methods:
        raise SystemExit(f"--methods {text!r}: add {baseline!r}; every speedup is measured against it in the same run")
    return methods


def ratio_cell(entry: dict, key: str) -> str:
    """A table cell for an optional ratio: '-' when its baseline was not run."""
    return f"{entry[key]:.2f}" if key in entry else "-"


def resolve_device(name: str) -> str:
    """``--device``: "cpu", "cuda", "cuda:N" or "auto" (cuda when torch sees a GPU, else cpu)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise SystemExit(f"--device: expected cpu, cuda, cuda:N or auto, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: torch {torch.__version__} sees no CUDA device (a CPU-only build, or no GPU)")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise SystemExit(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s), numbered from 0")
    return name


def synchronize(device: str | torch.device) -> None:
    """Wait for queued GPU work, so a host clock read after it times the work (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


# ---------------------------------------------------------------------------------------------
# bench engine


BENCH_LLAMA_SHAPES = {
    "default": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=8),
    "small": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4),
    # Janus-Pro-7B's language model (a Llama: 30 layers, 4096 wide, 32 heads) with its
    # 16,384-code image head as the output layer: the shape SJD-PAC decodes on a GPU
    "janus-pro-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=30, num_attention_heads=32,
                         num_key_value_heads=32, rms_norm_eps=1e-6),
}


def build_bench_llama(size: str, dtype: torch.dtype, seed: int = 0, device: str = "cpu"):
    """A random-weight LlamaForCausalLM (vocab 16384): "default" ~60M parameters, "small" for CI,
    "janus-pro-7b" ~6.5B (built on ``device`` directly, in ``dtype``: no fp32 copy on the host)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=16384, max_position_embeddings=4096, tie_word_embeddings=False, **BENCH_LLAMA_SHAPES[size])
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default_dtype)
    return model.to(dtype).eval()


def forward_cost_ratio(model: Any, device: str, tokens: int, context: int, repeats: int = 5) -> float:
    """Seconds of one ``tokens``-token forward over a ``context``-token cache, over a 1-token
    forward's (median of ``repeats``): the window cost a speculative step pays for its forward."""
    from transformers import DynamicCache

    from raydec.models.base import cache_keyword, decoding_attention

    def timed_forward(n: int, cache: Any) -> float:
        ids = torch.zeros((1, n), dtype=torch.long, device=device)
        positions = torch.arange(context, context + n, device=device).unsqueeze(0)
        synchronize(device)
        start = time.perf_counter()
        model(input_ids=ids, position_ids=positions, use_cache=True, **{cache_keyword(model): cache})
        synchronize(device)
        cache.crop(-n)  # drop the n tokens just written
        return time.perf_counter() - start

    with torch.inference_mode(), decoding_attention(device):
        cache = DynamicCache()
        model(input_ids=torch.zeros((1, context), dtype=torch.long, device=device), use_cache=True, **{cache_keyword(model): cache})
        seconds = {n: [] for n in (1, tokens)}
        for _ in range(repeats + 1):  # the first round warms up
            for n in seconds:
                seconds[n].append(timed_forward(n, cache))
    return statistics.median(seconds[tokens][1:]) / statistics.median(seconds[1][1:])


def _self_consistent_reference(target, window: int, config, prompt: list[int], ar_tokens: list[int], passes: int = 3) -> list[int]:
    """The oracle's drafts: the greedy output of the oracle run itself.

    In bfloat16 a 17-token window and a 1-token forward round logits differently, so greedy
    ties can break differently and the windowed output may leave the AR output; an oracle that
    keeps drafting the AR tokens after that point measures nothing. Re-run with the last
    output as the reference until it reproduces itself (not timed).
    """
    from raydec.speculative.engine import Engine, RowRequest
    from raydec.speculative.proposers.random_tree import OracleProposer

    reference = ar_tokens
    for _ in range(passes):
        out = Engine(target, OracleProposer(window, {0: reference}), config).generate([RowRequest(prompt, seed=0)])[0]
        if out.tokens == reference:
            break
        reference = out.tokens
    return reference


def bench_engine(args: argparse.Namespace) -> dict:
    """Our AR vs Hugging Face generate(); an oracle proposer (window 16, T=0) vs our AR."""
    from raydec.config import DecodeConfig, DraftSpec, SamplingConfig
    from raydec.models.base import cache_keyword, decoding_attention
    from raydec.models.causal_lm import CausalLMTarget
    from raydec.speculative.engine import Engine, RowRequest
    from raydec.speculative.proposers.ar import ARProposer
    from raydec.speculative.proposers.random_tree import OracleProposer

    torch.set_num_threads(args.threads) if args.threads else None
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    device = resolve_device(args.device)
    model = build_bench_llama(args.size, dtype, device=device)
    target = CausalLMTarget(model)
    params = sum(p.numel() for p in model.parameters())
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 16384, (int(torch.randint(16, 33, (1,), generator=generator)),), generator=generator).tolist() for _ in range(args.prompts)]
    greedy = DecodeConfig(max_new_tokens=args.new_tokens, sampling=SamplingConfig(temperature=0.0), draft=DraftSpec(window=args.window))
    ar_engine = Engine(target, ARProposer(), greedy)

    def run_hf(prompt):
        ids = torch.tensor([prompt], device=device)
        with torch.inference_mode(), decoding_attention(device):  # the kernels our engine uses
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    # warm-up (allocator, kernels)
    ar_engine.generate([RowRequest(prompts[0], seed=0, max_new_tokens=4)])
    run_hf(prompts[0][:4])

    times = {name: MethodTimes() for name in ("hf", "ar", "oracle")}
    mismatches, oracle_drift = 0, 0
    for i, prompt in enumerate(prompts):
        synchronize(device)
        t_hf, hf_tokens = _timed(lambda: run_hf(prompt))
        t_ar, ar_out = _timed(lambda: ar_engine.generate([RowRequest(prompt, seed=i)])[0])
        reference = _self_consistent_reference(target, args.window, greedy, prompt, ar_out.tokens)
        oracle = Engine(target, OracleProposer(args.window, {0: reference}), greedy)
        t_or, or_out = _timed(lambda: oracle.generate([RowRequest(prompt, seed=i)])[0])
        mismatches += int(hf_tokens != ar_out.tokens)
        oracle_drift += sum(a != b for a, b in zip(or_out.tokens, ar_out.tokens))
        for name, seconds, out, forwards in (
            ("hf", t_hf, hf_tokens, len(hf_tokens)),
            ("ar", t_ar, ar_out.tokens, ar_out.stats.target_forwards),
            ("oracle", t_or, or_out.tokens, or_out.stats.target_forwards),
        ):
            times[name].seconds.append(seconds)
            times[name].tokens.append(len(out))
            times[name].forwards.append(forwards)
        logger.info("prompt %d/%d: hf %.2fs ar %.2fs oracle %.2fs", i + 1, len(prompts), t_hf, t_ar, t_or)

    ar_total = times["ar"].total_seconds
    oracle_speedup = ar_total / times["oracle"].total_seconds
    # the forward of a (window + 1)-token step over a cache of prompt + half the new tokens
    window_cost = forward_cost_ratio(model, device, args.window + 1, context=24 + args.new_tokens // 2)
    result = {
        "model": {"parameters": params, "dtype": args.dtype, "vocab_size": 16384, "size": args.size},
        "device": device,
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "window": args.window,
        "ar_vs_hf_time_ratio": ar_total / times["hf"].total_seconds,
        "oracle_tokens_per_forward": times["oracle"].tokens_per_forward,
        "oracle_speedup": oracle_speedup,
        "window_forward_cost": window_cost,
        # measured speedup over the ideal one (compression / window cost): what the step's work
        # outside the target forward leaves of the speculation's gain
        "engine_efficiency": oracle_speedup / (times["oracle"].tokens_per_forward / window_cost),
        "hf_vs_ar_mismatched_prompts": mismatches,
        "oracle_vs_ar_mismatched_tokens": oracle_drift,
        "methods": {
            name: {
                "total_seconds": t.total_seconds,
                "median_seconds": statistics.median(t.seconds),
                "tokens_per_forward": t.tokens_per_forward,
                "tokens_per_second": sum(t.tokens) / t.total_seconds,
            }
            for name, t in times.items()
        },
    }
    rows = [
        [name, f"{t.total_seconds:.2f}", f"{sum(t.tokens) / t.total_seconds:.1f}", f"{t.tokens_per_forward:.2f}",
         f"{ar_total / t.total_seconds:.2f}x"]
        for name, t in times.items()
    ]
    print_table(
        f"bench engine: {params / 1e6:.1f}M-param Llama ({args.dtype}), {args.prompts} prompts x {args.new_tokens} tokens, batch 1",
        ["method", "seconds", "tokens/s", "tokens/forward", "speed vs our AR"],
        rows,
    )
    print(f"ar_vs_hf_time_ratio={result['ar_vs_hf_time_ratio']:.3f}  oracle_tokens_per_forward="
          f"{result['oracle_tokens_per_forward']:.2f}  oracle_speedup={result['oracle_speedup']:.2f}  "
          f"window_forward_cost={window_cost:.2f}  engine_efficiency={result['engine_efficiency']:.2f}  "
          f"prompts where hf != our AR: {mismatches}; oracle tokens != AR tokens: {oracle_drift}")
    return result


def add_engine_parser(subparsers) -> None:
    parser = subparsers.add_parser("engine", help="engine AR vs HF generate; oracle proposer vs AR")
    parser.add_argument("--prompts", type=positive_int, default=6, help="number of prompts (batch 1 each)")
    parser.add_argument("--new-tokens", type=positive_int, default=128, help="tokens generated per prompt")
    parser.add_argument("--window", type=positive_int, default=16, help="oracle draft window")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (cuda when torch sees a GPU)")
    parser.add_argument("--size", choices=list(BENCH_LLAMA_SHAPES), default="default",
                        help="default ~60M params; small for smoke tests; janus-pro-7b: Janus-Pro-7B's language model "
                             "with its 16,384-code image head, random weights, built on --device (a GPU: ~13 GB in bf16)")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--json", type=json_path_arg, default=None, help="write results here")
    parser.set_defaults(bench=bench_engine)


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if argv[:1] == ["pipeline"]:
        from raydec.bench_pipeline import main as bench_pipeline_main

        return bench_pipeline_main(argv)
    parser = argparse.ArgumentParser(prog="raydec bench", description=__doc__)
    subparsers = parser.add_subparsers(dest="which", required=True)
    add_engine_parser(subparsers)
    from raydec.bench_t2i import add_t2i_parser

    add_t2i_parser(subparsers)
    from raydec.bench_caption import add_caption_parser

    add_caption_parser(subparsers)
    from raydec.bench_step import add_step_parser

    add_step_parser(subparsers)
    subparsers.add_parser("pipeline", help="Ray Data pipeline vs the engine in one process (see `raydec bench pipeline -h`)")
    args = parser.parse_args(argv)
    return run_bench(args)
