"""How much each caption draft gets from seeing the image itself.

    python benchmarks/draft_image_ablation.py --images 60 --temperature 0

Both reference drafts read the target's last hidden states, which already carry what the target
took from the image. This decodes the same held-out shapes images, prompt and seeds with each
draft twice: as shipped, and *blind*, with every image pair dropped from the draft's input (no
image tokens for EAGLE; no compressed tokens and no global feature for ViSpec; text positions
keep their numbering, as after ViSpec's compression). The drop in tokens per forward is what
seeing the image is worth to that draft. Outputs stay lossless either way: only the drafts change.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch

from raydec.bench.common import json_path_arg, positive_int, write_json


@contextmanager
def blind_drafts():
    """Within the block, ``VispecDraft.build_sequence`` keeps only the text pairs."""
    from raydec.models.vispec_draft import DraftSequence, VispecDraft

    original = VispecDraft.build_sequence

    def text_pairs_only(self, token_embeds, features, token_image, positions):
        keep = token_image < 0  # [n]
        return DraftSequence(token_embeds[keep], features[keep], positions[keep], torch.full_like(positions[keep], -1),
                             token_embeds.new_zeros(0, token_embeds.shape[-1]))

    VispecDraft.build_sequence = text_pairs_only
    try:
        yield
    finally:
        VispecDraft.build_sequence = original


def main(argv: list[str] | None = None) -> dict:
    from raydec.config import SamplingConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=positive_int, default=60)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--json", type=json_path_arg, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    try:
        sampling = SamplingConfig(temperature=args.temperature)
    except ValueError as error:
        parser.error(f"--temperature: {error}")

    from raydec.api import caption_images, load_target
    from raydec.config import DecodeConfig, DraftTreeConfig
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, to_pil

    target = load_target("reference", "caption", dtype=getattr(torch, args.dtype))
    images = [to_pil(make_sample(HELD_OUT_SEED_START + i).image) for i in range(args.images)]
    seeds = list(range(args.images))
    tree = DraftTreeConfig.for_temperature(args.temperature)

    def tokens_per_forward(method: str) -> float:
        decode = DecodeConfig(method=method, sampling=sampling, draft_tree=tree, max_new_tokens=args.max_new_tokens)
        results = caption_images(images, model=target, decode=decode, seeds=seeds, batch_size=1)
        return sum(r.num_tokens for r in results) / sum(r.target_forwards for r in results)

    print(f"draft image ablation: reference VLM, {args.images} images, temperature {args.temperature}, "
          f"tree depth {tree.depth} top_k {tree.top_k} total {tree.total_tokens}")
    print(f"{'draft':8} {'sees image':>10} {'blind':>8} {'blind÷sees':>10}")
    table = {}
    for method in ("eagle", "vispec"):
        sees = tokens_per_forward(method)
        with blind_drafts():
            blind = tokens_per_forward(method)
        table[method] = {"sees_image": sees, "blind": blind, "ratio": blind / sees}
        print(f"{method:8} {sees:>10.2f} {blind:>8.2f} {blind / sees:>10.2f}", flush=True)
    result = {"settings": vars(args), "tokens_per_forward": table}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
