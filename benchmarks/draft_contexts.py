"""How well a caption draft matches the target on greedy and on sampled captions.

    python benchmarks/draft_contexts.py --images 30 [--draft vispec=DIR --draft eagle=DIR]

The target captions held-out shapes images at each ``--temperatures`` value (AR, float32). Each
draft then reads those captions exactly as in training (``raydec.train.step.build_pairs``, no
feature noise): pass 0 reads the target's own features, pass k > 0 its own outputs of pass k - 1.
Per draft, context temperature and pass, over the captions' generated positions:

- top-1: the draft's argmax is the target's;
- TV: total variation between the draft's q and the target's P;
- P on q's top-K: P's mass on the draft's K best tokens. At a top-K tree level with one-hot drafts,
  recursive rejection accepts with exactly this probability. P's own top-K mass bounds it.

A draft trained on greedy answers only scores high on greedy contexts and low on sampled ones
(docs/benchmarks.md, session 20).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from raydec.bench.common import json_path_arg, positive_int, write_json
from raydec.reference.llava.draft_command import temperatures_arg


def _draft_arg(text: str) -> tuple[str, str]:
    name, _, path = text.partition("=")
    if not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name, path


@torch.inference_mode()
def context_stats(target, draft, samples, passes: int, top_k: int) -> list[dict[str, float]]:
    """Per pass: top1, tv, p_on_q_topk, p_topk (means over supervised positions)."""
    from raydec.train.config import DraftTrainConfig
    from raydec.train.step import build_pairs

    config = DraftTrainConfig(feature_noise=0.0, mtp_steps=max(0, passes - 1))
    pairs = build_pairs(draft, samples, 0, config, torch.device("cpu"))
    mask, weight = pairs.attention_mask(), pairs.supervised
    p = torch.softmax(target.head(pairs.target_hidden).float(), dim=-1)  # [B, N, V]
    k = min(top_k, p.shape[-1])
    own = p.topk(k, dim=-1).values.sum(-1)[weight].mean().item()
    features, rows = pairs.features, []
    for _ in range(passes):
        hidden = draft(pairs.token_embeds, features, pairs.positions, mask, None, pairs.globals_, pairs.use_global)
        q = torch.softmax(target.head(hidden).float(), dim=-1)
        rows.append({
            "top1": (q.argmax(-1) == p.argmax(-1))[weight].float().mean().item(),
            "tv": (0.5 * (q - p).abs().sum(-1))[weight].mean().item(),
            "p_on_q_topk": p.gather(-1, q.topk(k, dim=-1).indices).sum(-1)[weight].mean().item(),
            "p_topk": own,
        })
        shifted = torch.cat([features[:, :1], hidden[:, :-1]], dim=1)  # the draft's own features, shifted right
        features = torch.where(pairs.rollout.unsqueeze(-1), shifted, pairs.features)
    return rows


def caption_samples(target, seeds: list[int], prompt: str, temperature: float, max_new_tokens: int) -> list:
    """The target's AR captions of ``seeds`` at ``temperature`` as training samples (``DraftSample``)."""
    from raydec.models.hf_vlm import VlmPrompt
    from raydec.reference.shapes import make_sample, to_pil
    from raydec.train.config import DataGenConfig
    from raydec.train.datagen import caption_seeds, sample_tensors
    from raydec.train.dataset import DraftSample

    config = DataGenConfig(num_samples=1, prompt=prompt, max_new_tokens=max_new_tokens, temperatures=[temperature], batch_size=10)
    images = [to_pil(make_sample(seed).image) for seed in seeds]
    samples = []
    for seed, image, result in zip(seeds, images, caption_seeds(target, seeds, images, config)):
        t = sample_tensors(target, VlmPrompt(target.format_prompt(prompt, 1), [image]), result.tokens)
        samples.append(DraftSample(seed, int(t["prompt_len"]), t["input_ids"], t["image_index"], t["loss_mask"], t["embeds"], t["hidden"]))
    return samples


def main(argv: list[str] | None = None) -> dict:
    from raydec.train.config import DEFAULT_PROMPT, HELD_OUT_SEED_START

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="reference", help="target VLM ('reference' or a folder)")
    parser.add_argument("--draft", type=_draft_arg, action="append", default=None,
                        help="NAME=DIR (repeatable); default: the reference VLM's shipped vispec and eagle drafts")
    parser.add_argument("--images", type=positive_int, default=30)
    parser.add_argument("--first-seed", type=int, default=HELD_OUT_SEED_START + 500)
    parser.add_argument("--temperatures", type=temperatures_arg, default=[0.0, 1.0], help="context temperatures, e.g. 0,1")
    parser.add_argument("--passes", type=positive_int, default=4, help="rollout passes (1 = the target's features only)")
    parser.add_argument("--top-k", type=positive_int, default=4)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--json", type=json_path_arg, default=None, help="also write the table here")
    args = parser.parse_args(argv)

    from raydec.api import load_target
    from raydec.models.registry import REFERENCE_DRAFT_DIRS
    from raydec.models.vispec_draft import VispecDraft

    torch.set_num_threads(args.threads)
    target = load_target(args.model, task="caption", dtype=torch.float32)
    drafts = dict(args.draft) if args.draft else {m: str(REFERENCE_DRAFT_DIRS[m]) for m in ("vispec", "eagle")}
    loaded = {name: VispecDraft.from_pretrained(Path(path), target=target, dtype=torch.float32).eval() for name, path in drafts.items()}
    seeds = list(range(args.first_seed, args.first_seed + args.images))
    print(f"draft contexts: {args.model}, {args.images} images (seeds {seeds[0]}..{seeds[-1]}), float32, top-{args.top_k}")
    print(f"{'draft':10} {'contexts':>8} {'pass':>4} {'top-1':>6} {'TV':>6} {'P on q top-K':>12} {'P top-K':>8}")
    table: dict[str, dict[str, list[dict[str, float]]]] = {name: {} for name in loaded}
    for temperature in args.temperatures:
        samples = caption_samples(target, seeds, args.prompt, temperature, args.max_new_tokens)
        for name, draft in loaded.items():
            rows = context_stats(target, draft, samples, args.passes, args.top_k)
            table[name][f"T={temperature:g}"] = rows
            for k, row in enumerate(rows):
                print(f"{name:10} {'T=%g' % temperature:>8} {k:>4} {row['top1']:>6.3f} {row['tv']:>6.3f} "
                      f"{row['p_on_q_topk']:>12.3f} {row['p_topk']:>8.3f}", flush=True)
    result = {"settings": {**vars(args), "draft": drafts}, "by_draft": table}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
