"""The tokens every method decodes on the benches' first held-out prompts and images, for any
raydec version: a refactor that changes no behaviour must print the same digests.

    python benchmarks/token_digest.py --prompts 24 --images 24 --json after.json
    PYTHONPATH=/path/to/old/worktree python benchmarks/token_digest.py ... --json before.json

Text-to-image: the bench t2i prompts (held-out shapes prompts, seeds 0..N-1) with ar, sjd,
sjd_ac and sjd_pac at fixed shapes; captions: the bench caption images with ar, eagle and
vispec at T=0 and T=1. bf16, batch 1, as the benches run. Per method: a SHA-256 of all its
token lists, and the lists themselves in the JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch


def _api():
    """(generate_images, caption_images, load, the Jacobi draft config class) under either layout."""
    from raydec import api, config

    load = getattr(api, "load_target", None) or api.load_pipeline  # load_pipeline before the layout change
    draft = getattr(config, "JacobiDraftConfig", None) or config.DraftSpec
    caption_task = "caption" if hasattr(api, "load_target") else "vlm"
    return api.generate_images, api.caption_images, load, draft, caption_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import raydec
    from raydec.config import DecodeConfig, SamplingConfig
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil

    generate_images, caption_images, load, draft, caption_task = _api()
    tokens: dict[str, list[list[int]]] = {}
    t2i = load("reference", "t2i", dtype=torch.bfloat16)
    prompts = [make_sample(HELD_OUT_SEED_START + i).prompt for i in range(args.prompts)]
    shapes = {
        "ar": None, "sjd": draft(window=32, init="left"), "sjd_ac": draft(window=48, init="left"),
        "sjd_pac": draft(window=48, branching=3, tree_depth=1, init="left"),
    }
    for method, shape in shapes.items():
        shape_field = "jacobi" if "jacobi" in DecodeConfig.model_fields else "draft"  # "draft" before the rename
        decode = DecodeConfig(method=method) if shape is None else DecodeConfig(method=method, **{shape_field: shape})
        results = generate_images(prompts, model=t2i, decode=decode, seeds=list(range(len(prompts))), batch_size=1)
        tokens[f"t2i/{method}"] = [list(r.tokens) for r in results]
    vlm = load("reference", caption_task, dtype=torch.bfloat16)
    images = [to_pil(make_sample(HELD_OUT_SEED_START + i).image) for i in range(args.images)]
    for temperature in (0.0, 1.0):
        for method in ("ar", "eagle", "vispec"):
            decode = DecodeConfig(method=method, sampling=SamplingConfig(temperature=temperature))
            results = caption_images(images, model=vlm, decode=decode, seeds=list(range(len(images))), batch_size=1)
            tokens[f"caption_T{temperature:g}/{method}"] = [list(r.tokens) for r in results]
    digests = {key: hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16] for key, value in tokens.items()}
    for key, digest in digests.items():
        print(f"{key:24s} {digest}")
    if args.json:
        args.json.write_text(json.dumps({"raydec": str(Path(raydec.__file__).parent), "digests": digests, "tokens": tokens}))


if __name__ == "__main__":
    main()
