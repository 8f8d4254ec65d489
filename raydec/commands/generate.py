"""``raydec generate``: text to PNG files, in this process (no Ray).

    raydec generate "a red circle on the left" "a blue square at the top" --out pngs/
    raydec generate --prompts-file prompts.txt --method sjd_pac --out pngs/
    raydec generate --parquet prompts.parquet --column prompt --out pngs/
    raydec generate "a red circle" --model /models/emu3-gen --size 512x768 --out pngs/

Writes OUT/<id>.png per prompt and OUT/results.jsonl (prompt, seed, method, coupling, decoding statistics).
For many prompts on a cluster, use a batch job (``raydec run``).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from raydec.commands.local_inputs import add_decode_flags, decode_config, read_texts
from raydec.config import IMAGE_METHODS, DecodeConfig, parse_image_size
from raydec.validation import check_folder


def decoded_method(asked: str, results: list) -> str:
    """The method the images were decoded with, saying so when an auto draft shape chose plain AR over ``asked``."""
    methods = sorted({result.method for result in results}) or [asked]
    if methods == ["ar"] and asked != "ar":
        return f"ar: plain AR, which the auto draft shape chose over {asked} at this batch size"
    return ", ".join(methods)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raydec generate", description=__doc__.splitlines()[0],
                                     epilog="\n".join(__doc__.splitlines()[2:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompts", nargs="*", help="prompts (or use --prompts-file / --parquet)")
    parser.add_argument("--prompts-file", type=Path, default=None, help="a text file with one prompt per line")
    parser.add_argument("--parquet", type=Path, default=None, help="a Parquet file of prompts (ids from its 'id' column)")
    parser.add_argument("--column", default="prompt", help="the --parquet column holding prompts (default: prompt)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs and results.jsonl")
    add_decode_flags(parser, IMAGE_METHODS, "sjd_pac")
    parser.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (default: the checkpoint's)")
    parser.add_argument("--size", default=None, metavar="WIDTHxHEIGHT",
                        help="image size in pixels (Emu3: multiples of 8; Lumina-mGPT / Chameleon: multiples of 32; Janus: its "
                             "one size); default: the model's own")
    parser.add_argument("--vqgan", default=None, metavar="FOLDER",
                        help="Lumina-mGPT / Chameleon: the VQ-GAN's folder, hub id or s3:// prefix (vqgan.yaml, vqgan.ckpt); "
                             "default: MODEL/vqgan")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ids, prompts = read_texts(args.prompts, args.prompts_file, args.parquet, args.column)
    decode = decode_config(args, "sjd_pac")
    if args.cfg_scale is not None:
        decode.setdefault("sampling", {})["cfg_scale"] = args.cfg_scale
    # what can be checked before the model loads (a user error ends the command in one message: raydec.cli)
    coupling = DecodeConfig.model_validate(decode).coupling
    parse_image_size(args.size, "--size")
    check_folder(args.out, "--out")
    import torch

    from raydec.api import generate_images, load_target  # lazy: keeps raydec generate --help light

    target = load_target(args.model, task="t2i", dtype=getattr(torch, args.dtype), device=args.device, vqgan_path=args.vqgan)
    results = generate_images(prompts, model=target, decode=decode, seeds=[args.seed + i for i in range(len(prompts))],
                              batch_size=args.batch_size, progress=True, size=args.size)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "results.jsonl").open("w") as log:
        for row_id, prompt, result in zip(ids, prompts, results):
            path = args.out / f"{row_id}.png"
            result.image.save(path)
            log.write(json.dumps({"id": row_id, "prompt": prompt, "seed": result.seed, "image": str(path), "method": result.method, "plan": result.plan,
                                  "coupling": coupling, "target_forwards": result.target_forwards,
                                  "tokens_per_forward": result.tokens_per_forward, "latency_s": result.latency_s}) + "\n")
    mean = sum(r.tokens_per_forward for r in results) / max(1, len(results))
    print(f"raydec generate: {len(results)} image(s) in {args.out} ({decoded_method(decode['method'], results)}, "
          f"{mean:.2f} tokens per target forward)")
    return 0
