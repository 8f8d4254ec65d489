"""SJD, SJD + AC and SJD-PAC on exact toy textures of set neighbour dependence.

    python benchmarks/texture_dependence.py --betas 0 0.5 1 2 --levels 3

Each texture is a first-order chain over ``--levels`` values in which a token repeats its left
neighbour with weight e^beta (``raydec.reference.textures.potts_texture``): beta = 0 draws every
token independently, as the shapes world's "iid" texture draws its speckles and noisy ground;
larger beta makes the next token depend on the last, as a photograph's texture does (the
"runs" texture of the shipped T2I model repeats with probability 0.7: beta = ln 4.67 = 1.54). The real engine and
proposers decode ``--sequences`` sequences of ``--length`` tokens per method, same seeds, and the
table gives tokens committed per target forward (the prefill counted, as ``raydec bench t2i``
counts step compression). Forwards only: the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import math

import torch

from raydec.bench.common import count_arg, json_path_arg, positive_int, write_json

METHODS = ("sjd", "sjd_ac", "sjd_pac")


def non_negative_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def tokens_per_forward(target, method: str, args) -> float:
    from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
    from raydec.speculative.engine import Engine
    from raydec.speculative.requests import RowRequest
    from raydec.speculative.proposers.jacobi import JacobiProposer

    tree = dict(branching=args.branching, tree_depth=args.tree_depth) if method == "sjd_pac" else {}
    config = DecodeConfig(method=method, max_new_tokens=args.length, sampling=SamplingConfig(temperature=1.0),
                          draft=JacobiDraftConfig(window=args.window, init=args.init, **tree))
    engine = Engine(target, JacobiProposer(config.draft, method, args.init), config.sampling, config.max_new_tokens)
    rows = engine.generate([RowRequest([0], seed=seed) for seed in range(args.sequences)])
    return sum(len(r.tokens) for r in rows) / sum(r.stats.target_forwards for r in rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--betas", type=non_negative_float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--levels", type=count_arg(2), default=3, help="values a textured token takes (the shapes world: 3)")
    parser.add_argument("--length", type=positive_int, default=256, help="tokens per sequence (a reference image: 256)")
    parser.add_argument("--sequences", type=positive_int, default=16)
    parser.add_argument("--window", type=positive_int, default=32)
    parser.add_argument("--branching", type=positive_int, default=3, help="sjd_pac: K")
    parser.add_argument("--tree-depth", type=positive_int, default=1, help="sjd_pac: D-1")
    parser.add_argument("--init", default="left", choices=("uniform", "left"), help="fresh drafts")
    parser.add_argument("--json", type=json_path_arg, default=None, help="also write the table here")
    args = parser.parse_args(argv)

    from raydec.reference.textures import neighbour_tv, potts_texture

    torch.set_num_threads(1)
    print(f"texture dependence: {args.levels} levels, {args.sequences} x {args.length} tokens, window {args.window}, "
          f"sjd_pac K={args.branching} D-1={args.tree_depth}, {args.init} fresh drafts")
    print(f"{'beta':>5} {'P(repeat)':>9} {'neighbour TV':>12} " + " ".join(f"{m:>8}" for m in METHODS) + f" {'ac÷sjd':>7} {'pac÷sjd':>7}")
    table = []
    for beta in args.betas:
        target = potts_texture(args.levels, beta)
        per_method = {m: tokens_per_forward(target, m, args) for m in METHODS}
        repeat = math.exp(beta) / (math.exp(beta) + args.levels - 1)
        row = dict(beta=beta, p_repeat=repeat, neighbour_tv=neighbour_tv(target), tokens_per_forward=per_method,
                   ac_vs_sjd=per_method["sjd_ac"] / per_method["sjd"], pac_vs_sjd=per_method["sjd_pac"] / per_method["sjd"])
        table.append(row)
        print(f"{beta:>5.2f} {repeat:>9.2f} {row['neighbour_tv']:>12.3f} " + " ".join(f"{per_method[m]:>8.2f}" for m in METHODS)
              + f" {row['ac_vs_sjd']:>7.2f} {row['pac_vs_sjd']:>7.2f}", flush=True)
    result = {"settings": vars(args), "textures": table}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
