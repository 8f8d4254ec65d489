"""Where each caption draft misses, by word kind, and what a draft that read the image perfectly could gain.

    python benchmarks/caption_misses.py --images 60

A decode step ends where the draft's chain first disagrees with the target (or at the tree's
depth); the token the target commits there is the draft's miss. This decodes the same
held-out shapes images greedily with each ``--methods`` draft and sorts the misses by the word
kind of the missed token (``raydec.reference.judge.text.word_kind``): scene attributes an image
decides (colour, shape, fill, size, position, background, count) or phrasing ("other").

The **attribute oracle** replays each draft's own answers with every attribute miss turned
into a hit: steps then end only at the phrasing words that draft missed, or at the depth cap.
(Dense descriptions' relation words, "above" or "same", count as attributes: the image decides them.)
That is an upper bound on what any vision module could add to that draft on this testbed
at this tree (it also assumes the chain after a repaired miss stays right). Replaying with all
misses kept must give the measured forwards, and the table shows both. Greedy decoding only:
the figures do not depend on the machine.

``--simulate TABLE.json`` decodes nothing: it replays the ground truth's short and dense
descriptions with each token missed at its word kind's rate in a saved table (independently),
which bounds a testbed before any draft has been trained for it. With ``--share-sweep 0.3,0.5``
it also replays synthetic answers whose tokens are image-decided with each given probability,
at the table's pooled image-decided and phrasing miss rates: how the bound moves with the share
of an answer's words that the image decides.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch

from raydec.bench.common import json_path_arg, parse_methods, positive_int, write_json


def miss_positions(accepted_lengths: list[int], depth: int, length: int) -> list[int]:
    """Answer positions of the target's corrections: each decode step that committed fewer than
    ``depth + 1`` tokens ended at a miss. Positions count from the prefill's token (0), so the
    first decode step starts at 1."""
    misses, start = [], 1
    for committed in accepted_lengths:
        end = start + committed - 1  # the step's last (bonus) token
        if committed - 1 < depth and end < length:
            misses.append(end)
        start += committed
    return misses


def replay_forwards(length: int, misses: set[int], depth: int) -> int:
    """Decode steps for an answer of ``length`` tokens (prefill token included) if steps end
    exactly at ``misses`` or after ``depth + 1`` tokens."""
    forwards, pos = 0, 1
    while pos < length:
        forwards += 1
        stop = next((p for p in range(pos, min(pos + depth + 1, length)) if p in misses), None)
        pos = stop + 1 if stop is not None else pos + depth + 1
    return forwards


def tally(answers: list[tuple[list[str], list[int]]], depth: int) -> dict:
    """Per word kind: answer tokens and misses; decode forwards measured, replayed, and with
    the attribute misses repaired. answers: (words, accepted lengths) per answer."""
    from raydec.reference.judge.text import word_kind

    tokens, misses = Counter(), Counter()
    measured = replayed = oracle = 0
    for words, lengths in answers:
        tokens.update(word_kind(w) for w in words[1:])
        positions = miss_positions(lengths, depth, len(words))
        misses.update(word_kind(words[p]) for p in positions)
        measured += len(lengths)
        replayed += replay_forwards(len(words), set(positions), depth)
        oracle += replay_forwards(len(words), {p for p in positions if word_kind(words[p]) == "other"}, depth)
    committed = sum(len(words) - 1 for words, _ in answers)
    return {
        "tokens": dict(tokens), "misses": dict(misses), "forwards": measured, "replayed_forwards": replayed,
        "oracle_forwards": oracle, "tokens_per_forward": committed / max(1, measured),
        "oracle_tokens_per_forward": committed / max(1, oracle),
    }  # fmt: skip


def simulate(texts: list[str], rates: dict[str, float], depth: int, seed: int = 0) -> dict:
    """The attribute oracle's ratio on ``texts`` before any draft exists for them: each token
    misses with its word kind's ``rates`` (a measured draft's rates, e.g. on another testbed),
    independently; forwards are replayed with all misses and with the phrasing ones only."""
    import numpy as np

    from raydec.reference.judge.text import word_kind
    from raydec.reference.shapes import words as split

    rng = np.random.default_rng(seed)
    committed = forwards = oracle = 0
    shares: Counter = Counter()
    for text in texts:
        tokens = ["<prefill>", *split(text), "<eos>"]
        kinds = [word_kind(t) for t in tokens]
        shares.update(kinds[1:])
        misses = {p for p in range(1, len(tokens)) if rng.random() < rates.get(kinds[p], rates["other"])}
        forwards += replay_forwards(len(tokens), misses, depth)
        oracle += replay_forwards(len(tokens), {p for p in misses if kinds[p] == "other"}, depth)
        committed += len(tokens) - 1
    total = sum(shares.values())
    return {"texts": len(texts), "tokens": committed, "share": {k: v / total for k, v in shares.items()},
            "tokens_per_forward": committed / forwards, "oracle_tokens_per_forward": committed / oracle,
            "ratio": forwards / oracle}  # fmt: skip


def share_sweep(image_rate: float, phrasing_rate: float, shares: list[float], depth: int, length: int,
                answers: int = 400, seed: int = 0) -> list[dict]:
    """The attribute oracle's ratio on synthetic answers of ``length`` tokens whose tokens are
    image-decided with probability ``share`` (independently), each image-decided token missed at
    ``image_rate`` and each phrasing token at ``phrasing_rate``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for share in shares:
        forwards = oracle = 0
        for _ in range(answers):
            image = rng.random(length) < share
            missed = rng.random(length) < np.where(image, image_rate, phrasing_rate)
            misses = {p for p in range(1, length) if missed[p]}
            forwards += replay_forwards(length, misses, depth)
            oracle += replay_forwards(length, {p for p in misses if not image[p]}, depth)
        committed = answers * (length - 1)
        rows.append({"share": share, "tokens_per_forward": committed / forwards,
                     "oracle_tokens_per_forward": committed / oracle, "ratio": forwards / oracle})
    return rows


def simulate_main(args) -> dict:
    """``--simulate``: the ground truth's short and dense descriptions of the held-out images,
    at the miss rates of the first method in a saved ``--json`` table."""
    import json

    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample
    from raydec.reference.shapes.dense import dense_description

    saved = json.loads(args.simulate.read_text())
    method, table = next(iter(saved["methods"].items()))
    rates = {k: table["misses"].get(k, 0) / n for k, n in table["tokens"].items() if n}
    rates.setdefault("relation", max(rates.get(k, 0.0) for k in ("colour", "shape", "position")))
    samples = [make_sample(HELD_OUT_SEED_START + i) for i in range(args.images)]
    depth = args.depth or saved["tree"]["depth"]
    result = {"rates_from": f"{args.simulate} ({method})", "rates": rates, "depth": depth}
    print(f"simulated attribute oracle, {args.images} ground-truth answers, {method}'s miss rates per word kind "
          f"from {args.simulate}, tree depth {depth}")
    for name, texts in (("short", [s.description for s in samples]), ("dense", [dense_description(s) for s in samples])):
        result[name] = simulate(texts, rates, depth)
        r = result[name]
        attribute_share = 1 - r["share"].get("other", 0.0)
        print(f"{name:>6}: {r['tokens'] / r['texts']:.0f} tokens per answer, {attribute_share:.2f} of them image-decided; "
              f"tokens per decode forward {r['tokens_per_forward']:.2f}, oracle {r['oracle_tokens_per_forward']:.2f} "
              f"({r['ratio']:.2f}x)")
    if args.share_sweep:
        image = [k for k in table["tokens"] if k != "other"]
        image_rate = sum(table["misses"].get(k, 0) for k in image) / max(1, sum(table["tokens"][k] for k in image))
        length = round(result["dense"]["tokens"] / result["dense"]["texts"]) + 1  # + the prefill's token
        result["share_sweep"] = share_sweep(image_rate, rates["other"], args.share_sweep, depth, length)
        print(f"synthetic answers of {length - 1} tokens, image-decided tokens missed at {image_rate:.3f} and "
              f"phrasing at {rates['other']:.3f} (independently):")
        for row in result["share_sweep"]:
            print(f"  image-decided share {row['share']:.2f}: tokens per decode forward {row['tokens_per_forward']:.2f}, "
                  f"oracle {row['oracle_tokens_per_forward']:.2f} ({row['ratio']:.2f}x)")
    write_json(args.json, result)
    return result


def _shares(text: str) -> list[float]:
    """``--share-sweep``: comma-separated probabilities."""
    try:
        shares = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--share-sweep {text!r}: expected comma-separated numbers in [0, 1]") from None
    if not shares or any(not 0.0 <= x <= 1.0 for x in shares):
        raise argparse.ArgumentTypeError(f"--share-sweep {text!r}: expected comma-separated numbers in [0, 1]")
    return shares


def main(argv: list[str] | None = None) -> dict:
    from raydec.config import SamplingConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="reference")
    parser.add_argument("--methods", default="eagle,vispec", help="comma-separated drafted methods (eagle, vispec)")
    parser.add_argument("--images", type=positive_int, default=60)
    parser.add_argument("--prompt", default=None, help="instruction (default: the short caption prompt; dense: "
                        "'describe the image in detail .')")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--depth", type=positive_int, default=None, help="draft tree depth (default: the T=0 tree)")
    parser.add_argument("--top-k", type=positive_int, default=None)
    parser.add_argument("--total-tokens", type=positive_int, default=None)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--vispec-draft", default=None, help="ViSpec draft folder (default: the one shipped with --model)")
    parser.add_argument("--eagle-draft", default=None, help="EAGLE draft folder (default: the one shipped with --model)")
    parser.add_argument("--json", type=json_path_arg, default=None, help="also write the table here")
    parser.add_argument("--simulate", type=Path, default=None,
                        help="no decoding: replay the ground truth's short and dense descriptions at the miss rates "
                             "of a saved --json table (the bound of a testbed before drafts exist for it)")
    parser.add_argument("--share-sweep", type=_shares, default=None,
                        help="with --simulate: comma-separated image-decided shares of synthetic answers to replay")
    args = parser.parse_args(argv)
    if args.share_sweep and args.simulate is None:
        parser.error("--share-sweep replays a saved table's rates: give --simulate TABLE.json too")
    if args.simulate is not None:
        return simulate_main(args)
    methods = parse_methods(args.methods, ("eagle", "vispec"), baseline=None)

    from raydec.api import DEFAULT_CAPTION_PROMPT, caption_images, load_target
    from raydec.config import DecodeConfig, DraftTreeConfig
    from raydec.models.registry import resolve_draft_path
    from raydec.reference.judge.text import WORD_KINDS
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil

    target = load_target(args.model, "caption", dtype=getattr(torch, args.dtype))
    tokenizer = target.processor.tokenizer
    images = [to_pil(make_sample(HELD_OUT_SEED_START + i).image) for i in range(args.images)]
    default = DraftTreeConfig.for_temperature(0.0)
    shape = {"depth": args.depth, "top_k": args.top_k, "total_tokens": args.total_tokens}
    try:
        tree = DraftTreeConfig(**{**default.model_dump(), **{k: v for k, v in shape.items() if v is not None}})
    except ValueError as error:
        parser.error(f"draft tree: {error}")
    tables = {}
    for method in methods:
        draft = resolve_draft_path(args.model, method, getattr(args, f"{method}_draft"))
        decode = DecodeConfig(method=method, sampling=SamplingConfig(temperature=0.0), draft_tree=tree,
                              max_new_tokens=args.max_new_tokens, draft_model=str(draft))
        results = caption_images(images, prompt=args.prompt or DEFAULT_CAPTION_PROMPT, model=target, decode=decode,
                                 seeds=list(range(args.images)), batch_size=1)
        answers = [(tokenizer.convert_ids_to_tokens(r.tokens), r.accepted_lengths) for r in results]
        tables[method] = tally(answers, tree.depth)
    print(f"caption draft misses by word kind: {args.model}, {args.images} images, greedy, "
          f"tree depth {tree.depth} top_k {tree.top_k} total {tree.total_tokens}")
    # tokens: the first method's answers; each rate is over that method's own answers
    print(f"{'word kind':>10} {'tokens':>7} " + " ".join(f"{m + ' misses (rate)':>22}" for m in methods))
    for kind in WORD_KINDS:
        count = tables[methods[0]]["tokens"].get(kind, 0)
        cells = " ".join(f"{t['misses'].get(kind, 0):>13} ({t['misses'].get(kind, 0) / max(1, t['tokens'].get(kind, 0)):.3f})"
                         for t in tables.values())
        print(f"{kind:>10} {count:>7} {cells}")
    for method, t in tables.items():
        print(f"{method}: decode forwards {t['forwards']} (replayed from its misses {t['replayed_forwards']}), "
              f"tokens per decode forward {t['tokens_per_forward']:.2f}; attribute oracle {t['oracle_forwards']} forwards, "
              f"{t['oracle_tokens_per_forward']:.2f} ({t['forwards'] / max(1, t['oracle_forwards']):.2f}x)")
    result = {"settings": vars(args), "tree": tree.model_dump(), "methods": tables}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
