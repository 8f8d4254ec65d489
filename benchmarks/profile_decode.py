"""Where a decode step's time goes: cProfile of ViSpec captioning and SJD-PAC image generation.

    python benchmarks/profile_decode.py --device cuda --out DIR

Prints the top functions by own time, then raydec's by time with callees, for each run and writes the full stats (pstats files)
to DIR. On a GPU, time inside ``Tensor.cpu`` / ``tolist`` / ``item`` is mostly waiting for
queued kernels; the rest is the host-side Python of the engine, proposers and verifier.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path

import torch


def _report(profile: cProfile.Profile, title: str, out: Path, top: int) -> None:
    path = out / f"{title}.pstats"
    profile.dump_stats(str(path))
    for order, what in (("tottime", "own time"), ("cumulative", "time with callees, raydec's functions")):
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text).sort_stats(order)
        stats.print_stats(*((top,) if order == "tottime" else ("raydec", top)))
        print(f"\n===== {title} ({what}, top {top}; full stats in {path})")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--images", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("bench_out/profile"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from raydec.api import caption_images, generate_images, load_target
    from raydec.bench.common import resolve_device
    from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil

    device = resolve_device(args.device)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    place = None if device == "cpu" else device

    vlm = load_target("reference", "caption", dtype=dtype, device=place)
    images = [to_pil(make_sample(HELD_OUT_SEED_START + i).image) for i in range(args.images)]
    for method in ("ar", "vispec"):
        decode = DecodeConfig(method=method, sampling=SamplingConfig(temperature=0.0), max_new_tokens=128)
        run = lambda items, seeds: caption_images(items, model=vlm, decode=decode, seeds=seeds, batch_size=1)  # noqa: E731
        _profiled(run, images, f"caption_{method}", args)

    t2i = load_target("reference", "t2i", dtype=dtype, device=place)
    prompts = [make_sample(HELD_OUT_SEED_START + i).prompt for i in range(args.prompts)]
    for method, draft in (("ar", None), ("sjd_pac", JacobiDraftConfig(window=96, branching=3, tree_depth=1, init="left"))):
        decode = DecodeConfig(method=method, draft=draft) if draft else DecodeConfig(method=method)
        run = lambda items, seeds: generate_images(items, model=t2i, decode=decode, seeds=seeds, batch_size=1)  # noqa: E731
        _profiled(run, prompts, f"t2i_{method}", args)


def _profiled(run, items: list, title: str, args: argparse.Namespace) -> None:
    """Warm up on the first item, then profile ``run`` over all of them (seeds 0..n-1)."""
    run(items[:1], [0])
    profile = cProfile.Profile()
    profile.enable()
    run(items, list(range(len(items))))
    profile.disable()
    _report(profile, title, args.out, args.top)

if __name__ == "__main__":
    main()
