"""`raydec bench engine`: the engine's AR against Hugging Face ``generate`` on a random Llama,
and an oracle proposer (drafts = the known greedy output) against AR: the ceiling a proposer
of known compression reaches, and the engine's efficiency at it."""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from typing import Any, Callable

import torch

from raydec.bench.common import MethodTimes, json_path_arg, non_negative_int, positive_int, print_table, resolve_device
from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.base import cache_keyword, decoding_attention, synchronize
from raydec.speculative.engine import Engine
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.oracle import OracleProposer
from raydec.speculative.requests import RowRequest

logger = logging.getLogger(__name__)

def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out



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


def _self_consistent_reference(target, window: int, config, prompt: list[int], ar_tokens: list[int], passes: int = 3,
                               compile: str = "auto") -> list[int]:
    """The oracle's drafts: the greedy output of the oracle run itself.

    In bfloat16 a 17-token window and a 1-token forward round logits differently, so greedy
    ties can break differently and the windowed output may leave the AR output; an oracle that
    keeps drafting the AR tokens after that point measures nothing. Re-run with the last
    output as the reference until it reproduces itself (not timed).
    """
    reference = ar_tokens
    for _ in range(passes):
        out = Engine(target, OracleProposer(window, {0: reference}), config.sampling, config.max_new_tokens, compile=compile).generate(
            [RowRequest(prompt, seed=0)])[0]
        if out.tokens == reference:
            break
        reference = out.tokens
    return reference


def bench_engine(args: argparse.Namespace) -> dict:
    """Our AR vs Hugging Face generate(); an oracle proposer (window 16, T=0) vs our AR."""
    from raydec.models.causal_lm import CausalLMTarget  # lazy: keeps raydec bench --help light

    torch.set_num_threads(args.threads) if args.threads else None
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    device = resolve_device(args.device)
    model = build_bench_llama(args.size, dtype, device=device)
    target = CausalLMTarget(model)
    params = sum(p.numel() for p in model.parameters())
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 16384, (int(torch.randint(16, 33, (1,), generator=generator)),), generator=generator).tolist() for _ in range(args.prompts)]
    greedy = DecodeConfig(max_new_tokens=args.new_tokens, sampling=SamplingConfig(temperature=0.0), jacobi=JacobiDraftConfig(window=args.window))
    ar_engine = Engine(target, ARProposer(), greedy.sampling, greedy.max_new_tokens, compile=args.compile)

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
        reference = _self_consistent_reference(target, args.window, greedy, prompt, ar_out.tokens, compile=args.compile)
        oracle = Engine(target, OracleProposer(args.window, {0: reference}), greedy.sampling, greedy.max_new_tokens, compile=args.compile)
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

    # the forward of a (window + 1)-token step over a cache of prompt + half the new tokens
    window_cost = forward_cost_ratio(model, device, args.window + 1, context=24 + args.new_tokens // 2)
    return engine_report(args, device, params, times, window_cost, mismatches, oracle_drift)


def engine_report(args: argparse.Namespace, device: str, params: int, times: dict[str, MethodTimes], window_cost: float,
                  mismatches: int, oracle_drift: int) -> dict:
    """``bench_engine``'s result (the JSON written by ``--json``), printed as a table and a line of
    ratios. times: per method ("hf", "ar", "oracle") its seconds, tokens and forwards per prompt;
    window_cost: a (window + 1)-token forward / a one-token forward; mismatches: prompts where HF's
    tokens differ from our AR's; oracle_drift: tokens where the oracle's differ from AR's."""
    ar_total = times["ar"].total_seconds
    oracle_speedup = ar_total / times["oracle"].total_seconds
    result = {
        "model": {"parameters": params, "dtype": args.dtype, "vocab_size": 16384, "size": args.size},
        "device": device,
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "window": args.window,
        "compile": args.compile,
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
    parser.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                        help="capture the engines' step work (auto: on for CUDA, off on a CPU)")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--json", type=json_path_arg, default=None, help="write results here")
    parser.set_defaults(bench=bench_engine)
