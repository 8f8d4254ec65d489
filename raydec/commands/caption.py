"""``raydec caption``: images to captions (or answers), in this process (no Ray).

    raydec caption cat.png dog.jpg
    raydec caption --parquet images.parquet --column image --json captions.jsonl
    raydec caption photo.png --prompt "what colour is the square ?" --method vispec

Prints one caption per image; ``--json`` also writes them with their decoding statistics.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from raydec.commands.local_inputs import add_decode_flags, decode_config, read_images
from raydec.config import CAPTION_METHODS, DecodeConfig
from raydec.validation import check_folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raydec caption", description=__doc__.splitlines()[0],
                                     epilog="\n".join(__doc__.splitlines()[2:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="*", help="image files (or use --parquet)")
    parser.add_argument("--parquet", type=Path, default=None, help="a Parquet file with a column of image bytes or paths")
    parser.add_argument("--column", default="image", help="the --parquet column holding images (default: image)")
    parser.add_argument("--prompt", default=None, help="the question (default: the model's caption prompt)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="most tokens per answer (default 128)")
    parser.add_argument("--draft-model", default=None, help="vispec / eagle draft: a folder, a hub id (org/name[@revision]) or "
                        "s3://bucket/prefix (the reference VLM ships its own)")
    parser.add_argument("--json", type=Path, default=None, help="also write the captions and their statistics here (JSON lines)")
    add_decode_flags(parser, CAPTION_METHODS, "vispec")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ids, images = read_images(args.images, args.parquet, args.column)
    extra = {k: v for k, v in (("max_new_tokens", args.max_new_tokens), ("draft_model", args.draft_model)) if v is not None}
    decode = decode_config(args, "vispec", extra)
    # before the model loads (a user error ends the command in one message: raydec.cli)
    coupling = DecodeConfig.model_validate(decode).coupling
    if args.json is not None:
        check_folder(args.json.parent, "--json")
    import torch

    from raydec.api import DEFAULT_CAPTION_PROMPT, caption_images, load_target  # lazy: keeps raydec caption --help light

    target = load_target(args.model, task="caption", dtype=getattr(torch, args.dtype), device=args.device)
    results = caption_images(images, prompt=args.prompt or DEFAULT_CAPTION_PROMPT, model=target, decode=decode,
                             seeds=[args.seed + i for i in range(len(images))], batch_size=args.batch_size)
    for row_id, result in zip(ids, results):
        print(f"{row_id}: {result.caption}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with args.json.open("w") as log:
            for row_id, result in zip(ids, results):
                log.write(json.dumps({"id": row_id, "caption": result.caption, "seed": result.seed, "method": result.method, "plan": result.plan,
                                      "coupling": coupling, "target_forwards": result.target_forwards,
                                      "tokens_per_forward": result.tokens_per_forward, "latency_s": result.latency_s,
                                      "finish_reason": result.finish_reason}) + "\n")
    return 0
