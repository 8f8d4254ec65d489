"""``raydec check``: that a method decodes plain AR's tokens on your model, rows, dtype and device.

    raydec check --model reference --method sjd_pac --dtype float64 --json check.json
    raydec check --model /models/janus-pro-7b --method sjd_pac --dtype bfloat16 --device cuda --prompts-file prompts.txt
    raydec check --model /models/llava-1.6-7b --method vispec --draft-model /models/llava-vispec --parquet images.parquet

Decodes every row with plain AR and with the method (same seeds, coupling gumbel) and prints the
rows identical and, for each row that differs, its first differing position: a numeric near-tie
(the gap between the two tokens' perturbed scores within the dtype's rounding), or not. The method
says the task: sjd / sjd_ac / sjd_pac take prompts, vispec / eagle take images. Without rows, it
checks a few shipped ones (--rows). Exit status 0 when every difference is a near-tie, 1 when one
is not (a decoding bug: its row, position and both tokens are printed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from raydec.commands.local_inputs import add_decode_flags, decode_config, read_images, read_texts
from raydec.config import DRAFT_METHODS, JACOBI_METHODS, DecodeConfig, parse_image_size
from raydec.validation import check_folder

DTYPES = ("float32", "bfloat16", "float16", "float64")


def shipped_rows(task: str, count: int) -> tuple[list[str], list[Any]]:
    """``count`` held-out samples of the reference models' shapes world: prompts, or images to caption."""
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil  # lazy: only without rows

    samples = [make_sample(HELD_OUT_SEED_START + i) for i in range(count)]
    rows = [s.prompt for s in samples] if task == "t2i" else [to_pil(s.image) for s in samples]
    return [f"{i:05d}" for i in range(count)], rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raydec check", description=__doc__.splitlines()[0],
                                     epilog="\n".join(__doc__.splitlines()[2:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="*", help="prompts (sjd*) or image files (vispec, eagle); or --prompts-file / --parquet")
    parser.add_argument("--prompts-file", type=Path, default=None, help="a text file with one prompt per line (sjd*)")
    parser.add_argument("--parquet", type=Path, default=None, help="a Parquet file of prompts or images (ids from its 'id' column)")
    parser.add_argument("--column", default=None, help="the --parquet column (default: prompt, or image for captions)")
    parser.add_argument("--rows", dest="shipped", type=int, default=8, help="without rows: how many shipped ones to check (default 8)")
    parser.add_argument("--prompt", default=None, help="captions: the question (default: the model's caption prompt)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="captions: most tokens per answer (default 128)")
    parser.add_argument("--draft-model", default=None, help="vispec / eagle draft folder (the reference VLM ships its own)")
    parser.add_argument("--size", default=None, metavar="WIDTHxHEIGHT", help="text-to-image: image size (default: the model's own)")
    parser.add_argument("--reference-dtype", choices=DTYPES, default=None,
                        help="the precision a differing position is recomputed in (default: float64 for float32 / float64, "
                             "float32 for 16-bit dtypes)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="time the first rows with one-time costs in them")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here (JSON)")
    add_decode_flags(parser, JACOBI_METHODS + DRAFT_METHODS, "sjd_pac")
    args = parser.parse_args(argv)
    extra = {k: v for k, v in (("max_new_tokens", args.max_new_tokens), ("draft_model", args.draft_model)) if v is not None}
    decode = decode_config(args, "sjd_pac", extra)
    # what can be checked before the model loads (a user error ends the command in one message: raydec.cli)
    config = DecodeConfig.model_validate(decode)
    if config.coupling != "gumbel":
        raise ValueError(f"coupling: {config.coupling} has no row identity to check (a seed's tokens depend on the method and draft "
                         "shape); check with coupling: gumbel")
    task = "t2i" if config.method in JACOBI_METHODS else "caption"
    parse_image_size(args.size, "--size")
    if args.json is not None:
        check_folder(args.json.parent, "--json")
    if args.shipped < 1:
        raise ValueError(f"--rows: {args.shipped} must be >= 1")
    if not (args.rows or args.prompts_file or args.parquet):
        ids, rows = shipped_rows(task, args.shipped)
    elif task == "t2i":
        ids, rows = read_texts(args.rows, args.prompts_file, args.parquet, args.column or "prompt")
    else:
        if args.prompts_file is not None:
            raise ValueError(f"--prompts-file: {config.method} captions images; give image files or --parquet")
        ids, rows = read_images(args.rows, args.parquet, args.column or "image")
    import torch

    from raydec.api import DEFAULT_CAPTION_PROMPT  # lazy: keeps raydec check --help light
    from raydec.api.check import check_identity

    report = check_identity(
        rows, model=args.model, decode=decode, seeds=[args.seed + i for i in range(len(rows))], batch_size=args.batch_size,
        dtype=getattr(torch, args.dtype), device=args.device, prompt=args.prompt or DEFAULT_CAPTION_PROMPT, size=args.size,
        reference_dtype=getattr(torch, args.reference_dtype) if args.reference_dtype else None, ids=ids, warmup=args.warmup,
        progress=True,
    )
    print(report.table())
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": str(args.model), **report.as_dict()}, indent=1) + "\n")
    for row in report.bugs:
        print(f"raydec check: {bug_line(row, config.method)}")
    if not report.passed:
        return 1
    differing = len(report.rows) - report.identical_rows
    print("raydec check: passed: " + ("every row identical to AR's" if not differing else
                                      f"{differing} row(s) differ from AR's, each at a numeric near-tie"))
    return 0


def bug_line(row: Any, method: str) -> str:
    """One line naming a row whose difference is not a near-tie: its position and both tokens."""
    verdict = row.verdict
    if verdict is None:
        return (f"row {row.row_id} (seed {row.seed}): AR decoded {row.ar_length} tokens and {method} {row.method_length}, "
                "the same up to the shorter: not a numeric near-tie (a decoding bug)")
    return (f"row {row.row_id} (seed {row.seed}), position {verdict.position}: AR token {verdict.ar_token}, {method} token "
            f"{verdict.method_token}; gap {verdict.gap:.3g} > tolerance {verdict.tolerance:.3g} ({verdict.reference_dtype} forward picks "
            f"{verdict.reference_token}): not a numeric near-tie (a decoding bug)")
