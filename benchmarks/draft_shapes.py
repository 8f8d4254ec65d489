"""Step compression of fixed Jacobi draft shapes: target forwards only, no timing.

    python benchmarks/draft_shapes.py --prompts 48 sjd:64 sjd_ac:96 sjd_pac:96:3:1 sjd_pac:96:4:2

Each shape is ``method:window[:K:D-1]``, drafted with ``--init`` fresh drafts, on the same
held-out shapes prompts and seeds at batch 1. Step compression (generated tokens per target
forward, the prefill counted) depends only on the drafts and the seeds, not on the machine, so
this asks how far a tree shape can go regardless of what its window costs; `raydec bench t2i`
weighs the two.
"""

from __future__ import annotations

import argparse

import torch


def parse_shape(text: str):

    method, *numbers = text.split(":")
    if method not in ("sjd", "sjd_ac", "sjd_pac") or len(numbers) not in (1, 3) or not all(n.isdigit() for n in numbers):
        raise argparse.ArgumentTypeError(f"shape: expected method:window or sjd_pac:window:K:D-1, got {text!r}")
    window, branching, depth = (int(n) for n in (numbers if len(numbers) == 3 else (numbers[0], 1, 0)))
    return method, dict(window=window, branching=branching, tree_depth=depth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", type=parse_shape, help="method:window or sjd_pac:window:K:D-1")
    parser.add_argument("--model", default="reference")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--init", default="left", choices=("uniform", "left", "above"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--by-background", action="store_true", help="also split each shape's figures by the prompt's background")
    args = parser.parse_args()

    from raydec.api import generate_images, load_target
    from raydec.config import DecodeConfig, JacobiDraftConfig
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

    target = load_target(args.model, "t2i", dtype=getattr(torch, args.dtype))
    samples = [make_sample(HELD_OUT_SEED_START + i) for i in range(args.prompts)]
    prompts = [sample.prompt for sample in samples]
    seeds = list(range(args.prompts))
    print(f"draft shapes: {args.model}, {args.prompts} prompts, batch 1, {args.dtype}, {args.init} fresh drafts")
    print(f"{'method':8} {'window':>6} {'K':>3} {'D-1':>3} {'forwards/image':>15} {'step compression':>17}")
    for method, shape in args.shapes:
        decode = DecodeConfig(method=method, draft=JacobiDraftConfig(**shape, init=args.init))
        results = generate_images(prompts, model=target, decode=decode, seeds=seeds, batch_size=1)
        forwards = sum(r.target_forwards for r in results)
        tokens = sum(r.num_tokens for r in results)
        print(f"{method:8} {shape['window']:>6} {shape['branching']:>3} {shape['tree_depth']:>3} "
              f"{forwards / len(results):>15.2f} {tokens / forwards:>17.2f}", flush=True)
        if args.by_background:
            for background in sorted({sample.background for sample in samples}):
                rows = [r for r, sample in zip(results, samples) if sample.background == background]
                forwards = sum(r.target_forwards for r in rows)
                print(f"{'':8} {'':>6} {'':>3} {'':>3} {forwards / len(rows):>15.2f} {sum(r.num_tokens for r in rows) / forwards:>17.2f}"
                      f"   {background} background, {len(rows)} prompts", flush=True)


if __name__ == "__main__":
    main()
