"""Tokens per forward by position in the answer: does the text-only draft lose the image as it writes?

    python benchmarks/caption_position.py --images 60 --temperature 0

ViSpec's case against a text-only EAGLE draft is that the draft's one layer loses the image as
the answer grows, so EAGLE's acceptance decays along the answer while ViSpec's, fed the image's
global feature at every token, holds. This decodes the same held-out shapes images, prompt and
seeds with each ``--methods`` draft (the reference VLM's shipped drafts by default, the bench's
default tree for the temperature) and averages the tokens each decode forward commits by the
answer position at which the forward starts, in buckets of ``--bucket`` tokens. Forwards only:
the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from raydec.bench.common import json_path_arg, parse_methods, positive_int, write_json



def by_position(accepted: list[list[int]], bucket: int) -> dict[int, tuple[float, int]]:
    """Per bucket start: (mean tokens committed per forward, forwards) over every answer.

    accepted: per answer, the tokens each decode forward committed; the first forward starts at
    position 1 (position 0 is the prefill's token)."""
    sums: dict[int, list[int]] = {}
    for lengths in accepted:
        start = 1
        for committed in lengths:
            sums.setdefault(start // bucket * bucket, []).append(committed)
            start += committed
    return {b: (float(np.mean(v)), len(v)) for b, v in sorted(sums.items())}


def main(argv: list[str] | None = None) -> dict:
    from raydec.config import SamplingConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="reference")
    parser.add_argument("--methods", default="eagle,vispec", help="comma-separated drafted methods (eagle, vispec)")
    parser.add_argument("--images", type=positive_int, default=60)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--bucket", type=positive_int, default=8, help="answer positions per bucket")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--prompt", default=None, help="the question (default: the caption prompt)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--json", type=json_path_arg, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    methods = parse_methods(args.methods, ("eagle", "vispec"), baseline=None)
    try:
        sampling = SamplingConfig(temperature=args.temperature)
    except ValueError as error:
        parser.error(f"--temperature: {error}")

    from raydec.api import DEFAULT_CAPTION_PROMPT, caption_images, load_target
    from raydec.config import DecodeConfig, DraftTreeConfig
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil

    target = load_target(args.model, "caption", dtype=getattr(torch, args.dtype))
    images = [to_pil(make_sample(HELD_OUT_SEED_START + i).image) for i in range(args.images)]
    seeds = list(range(args.images))
    tree = DraftTreeConfig.for_temperature(args.temperature)
    prompt = args.prompt or DEFAULT_CAPTION_PROMPT
    tables, lengths = {}, {}
    for method in methods:
        decode = DecodeConfig(method=method, sampling=sampling, draft_tree=tree, max_new_tokens=args.max_new_tokens)
        results = caption_images(images, prompt=prompt, model=target, decode=decode, seeds=seeds, batch_size=1)
        tables[method] = by_position([r.accepted_lengths for r in results], args.bucket)
        lengths[method] = float(np.mean([r.num_tokens for r in results]))
    print(f"tokens per forward by answer position: {args.model}, {args.images} images, temperature {args.temperature}, "
          f"tree depth {tree.depth} top_k {tree.top_k} total {tree.total_tokens}; mean answer "
          + ", ".join(f"{m} {lengths[m]:.1f}" for m in methods) + " tokens")
    buckets = sorted({b for t in tables.values() for b in t})
    ratio = len(methods) == 2
    print(f"{'positions':>10} " + " ".join(f"{m + ' (n)':>16}" for m in methods) + (f" {methods[1] + '÷' + methods[0]:>14}" if ratio else ""))
    rows = []
    for b in buckets:
        cells = {m: tables[m].get(b) for m in methods}
        row = {"start": b, **{m: (None if c is None else {"tokens_per_forward": c[0], "forwards": c[1]}) for m, c in cells.items()}}
        text = " ".join(f"{'-':>16}" if c is None else f"{c[0]:>9.2f} ({c[1]:>4})" for c in cells.values())
        if ratio and all(cells.values()):
            row["ratio"] = cells[methods[1]][0] / cells[methods[0]][0]
            text += f" {row['ratio']:>14.2f}"
        rows.append(row)
        print(f"{f'{b}-{b + args.bucket - 1}':>10} {text}")
    result = {"settings": vars(args),
              "mean_answer_tokens": lengths, "buckets": rows}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
