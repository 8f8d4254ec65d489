"""Evaluate a reference model on held-out shapes prompts.

``python -m raydec.reference.janus.evaluate t2i --prompts 200`` samples images with Hugging Face's
own ``JanusForConditionalGeneration.generate(generation_mode="image")`` (the checkpoint's
default generation config unless overridden), scores them with the judge, and measures the
entropy of every sampled token's fully processed distribution (CFG mix, then temperature),
recomputed by one teacher-forced forward over the sampled tokens. Prints the mean judge score
and the share of tokens with entropy > 1 nat (and above 0.1 / 0.5 nats); ``--json`` / ``--grid`` save details.

``--word-sensitivity`` asks instead which prompt words the model reads: it replaces every
colour (shape, fill, size) word by the next one of its kind and prints the KL divergence
between the teacher-forced predictions before and after, on the held-out images' own tokens.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from raydec.reference.janus import model as jt
from raydec.reference.janus import pixels as px
from raydec.reference.judge import score_image
from raydec.reference.judge.image import parse_image
from raydec.reference.judge.text import parse_prompt
from raydec.reference.shapes import COLORS, FILLS, HELD_OUT_SEED_START, SHAPES, SIZES, make_sample

logger = logging.getLogger(__name__)

HIGH_ENTROPY_NATS = 1.0
ENTROPY_LINES = (0.1, 0.5, 1.0)  # nats: the shares of tokens above each are reported


def held_out_prompts(count: int, offset: int = 0) -> list[str]:
    """Prompts of held-out seeds ``HELD_OUT_SEED_START + offset ..``."""
    return [make_sample(HELD_OUT_SEED_START + offset + i).prompt for i in range(count)]


@torch.no_grad()
def generate_image_tokens(model, processor, prompts: Sequence[str], seed: int, **generate_kwargs) -> torch.Tensor:
    """HF ``generate(generation_mode="image")`` on ``prompts``; seeded per call. # [B, N]"""
    inputs = processor(text=list(prompts), generation_mode="image", padding=True, return_tensors="pt")
    torch.manual_seed(seed)
    return model.generate(
        input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, generation_mode="image", **generate_kwargs
    )


@torch.no_grad()
def decode_images(model, image_ids: torch.Tensor) -> np.ndarray:
    """Stock ``decode_image_tokens`` -> uint8 ``[B, H, W, 3]``."""
    pixels = model.decode_image_tokens(image_ids).float()  # [B, H, W, 3] in [-1, 1]
    return px.pixels_to_images(pixels.permute(0, 3, 1, 2)).numpy()


@torch.no_grad()
def processed_entropies(
    model, processor, prompts: Sequence[str], image_ids: torch.Tensor, guidance_scale: float, temperature: float
) -> torch.Tensor:
    """Entropy (nats) of the CFG-mixed, temperature-scaled distribution of each token. # [B, N]

    The conditional and unconditional rows are laid out as HF Janus ``generate`` does.
    """
    tokenizer = processor.tokenizer
    inputs = processor(text=list(prompts), generation_mode="image", padding=True, return_tensors="pt")
    boi = tokenizer.convert_tokens_to_ids(jt.BOI_TOKEN)
    uncond = jt.unconditional_ids(inputs.input_ids, tokenizer.bos_token_id, boi, tokenizer.pad_token_id)
    cond_logits = jt.image_token_logits(model, inputs.input_ids, inputs.attention_mask, image_ids).float()
    uncond_logits = jt.image_token_logits(model, uncond, inputs.attention_mask, image_ids).float()
    logits = uncond_logits + guidance_scale * (cond_logits - uncond_logits)
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def evaluate_t2i(
    model,
    processor,
    num_prompts: int,
    batch_size: int,
    seed: int,
    guidance_scale: float | None = None,
    temperature: float | None = None,
    offset: int = 0,
) -> dict:
    """Judge score and entropy statistics of AR samples on held-out prompts."""
    config = model.generation_config
    guidance_scale = config.guidance_scale if guidance_scale is None else guidance_scale
    temperature = (config.temperature or 1.0) if temperature is None else temperature
    prompts = held_out_prompts(num_prompts, offset)
    scores: list[float] = []
    entropies: list[torch.Tensor] = []
    images: list[np.ndarray] = []
    started = time.time()
    for begin in tqdm(range(0, len(prompts), batch_size), desc="evaluate t2i"):
        batch = prompts[begin : begin + batch_size]
        ids = generate_image_tokens(
            model, processor, batch, seed + begin, guidance_scale=guidance_scale, temperature=temperature
        )
        decoded = decode_images(model, ids)
        scores += [score_image(image, prompt) for image, prompt in zip(decoded, batch)]
        entropies.append(processed_entropies(model, processor, batch, ids, guidance_scale, temperature))
        images.append(decoded)
    entropy = torch.cat(entropies)
    all_images = np.concatenate(images)
    return {
        "prompts": len(prompts),
        "guidance_scale": guidance_scale,
        "temperature": temperature,
        "judge_mean": float(np.mean(scores)),
        "judge_stderr": float(np.std(scores) / np.sqrt(len(scores))),
        "judge_share_perfect": float(np.mean(np.asarray(scores) == 1.0)),
        "high_entropy_share": float((entropy > HIGH_ENTROPY_NATS).float().mean()),
        # a texture that repeats its left neighbour (shapes "runs") has ~0.8 nats per random
        # token, under the 1-nat line: the shares above lower lines show where its tokens sit
        "entropy_share_above": {str(nats): float((entropy > nats).float().mean()) for nats in ENTROPY_LINES},
        "mean_entropy_nats": float(entropy.mean()),
        "attribute_accuracy": attribute_accuracy_by_kind(all_images, prompts),
        "seconds": time.time() - started,
        "scores": scores,
        "_images": all_images,
        "_prompts": prompts,
    }


def attribute_accuracy_by_kind(images: Sequence[np.ndarray], prompts: Sequence[str]) -> dict[str, float]:
    """Where a judge score is lost: each stated object is paired with the object the judge reads
    in the same grid cell. ``drawn``: share of stated cells holding an object; ``colour`` /
    ``shape`` / ``fill`` / ``size``: share right among the drawn ones."""
    hits: dict[str, list[bool]] = {"drawn": [], "colour": [], "shape": [], "fill": [], "size": []}
    for image, prompt in zip(images, prompts):
        seen = {obj.position: obj for obj in parse_image(image).objects}
        for stated in parse_prompt(prompt).objects:
            found = seen.get(stated.position)
            hits["drawn"].append(found is not None)
            if found is not None:
                for kind, attribute in (("colour", "color"), ("shape", "shape"), ("fill", "fill"), ("size", "size")):
                    hits[kind].append(getattr(found, attribute) == getattr(stated, attribute))
    return {kind: float(np.mean(values)) if values else float("nan") for kind, values in hits.items()}


@torch.no_grad()
def vq_round_trip(model, num_images: int, offset: int = 0, batch_size: int = 50, texture: str = "runs") -> dict:
    """Judge score of held-out ground-truth images (drawn with ``texture``) after VQ encode -> stock ``decode``."""
    vq = model.model.vqmodel.eval()
    samples = [make_sample(HELD_OUT_SEED_START + offset + i, texture=texture) for i in range(num_images)]
    truth, decoded = [], []
    for begin in range(0, num_images, batch_size):
        batch = samples[begin : begin + batch_size]
        pixels = px.images_to_pixels(torch.from_numpy(np.stack([s.image for s in batch])))
        decoded.append(px.pixels_to_images(vq.decode(px.vq_encode(vq, pixels))).numpy())
        truth += [score_image(s.image, s.prompt) for s in batch]
    decoded_images = np.concatenate(decoded)
    scores = [score_image(image, s.prompt) for image, s in zip(decoded_images, samples)]
    return {
        "images": num_images,
        "round_trip_judge_mean": float(np.mean(scores)),
        "ground_truth_judge_mean": float(np.mean(truth)),
        "_images": decoded_images,
    }


WORD_KINDS: dict[str, tuple[str, ...]] = {"colour": tuple(COLORS), "shape": SHAPES, "fill": FILLS, "size": SIZES}


def replace_words(prompt: str, kind: str) -> str:
    """``prompt`` with every word of ``kind`` replaced by the next word of that kind (cyclically)."""
    words = WORD_KINDS[kind]
    return " ".join(words[(words.index(w) + 1) % len(words)] if w in words else w for w in prompt.split(" "))


@torch.no_grad()
def word_sensitivity(model, processor, num_images: int, offset: int = 0, texture: str = "runs") -> dict:
    """KL(pred(prompt) || pred(prompt with one kind of word replaced)) over the image tokens of
    held-out images (their own VQ ids, teacher-forced): mean over all tokens, mean over the
    tokens of object boxes, and the largest, per kind of word. Zero means the words are ignored."""
    from raydec.reference.janus.lm import object_token_mask

    samples = [make_sample(HELD_OUT_SEED_START + offset + i, texture=texture) for i in range(num_images)]
    ids = px.vq_encode(model.model.vqmodel, px.images_to_pixels(torch.from_numpy(np.stack([s.image for s in samples]))))
    on_object = torch.from_numpy(np.stack([object_token_mask(s.prompt) for s in samples]))  # [B, N]

    def log_probs(prompts: list[str]) -> torch.Tensor:  # [B, N, K]
        inputs = processor(text=prompts, generation_mode="image", padding=True, return_tensors="pt")
        return F.log_softmax(jt.image_token_logits(model, inputs.input_ids, inputs.attention_mask, ids).float(), dim=-1)

    base = log_probs([s.prompt for s in samples])
    result = {}
    for kind in WORD_KINDS:
        other = log_probs([replace_words(s.prompt, kind) for s in samples])
        kl = (base.exp() * (base - other)).sum(-1)  # [B, N]
        result[kind] = {"kl_mean": kl.mean().item(), "kl_mean_objects": kl[on_object].mean().item(), "kl_max": kl.max().item()}
    return result


def save_grid(images: np.ndarray, path: Path, columns: int = 8, scale: int = 3) -> None:
    """Save up to ``4 * columns`` images as one PNG grid."""
    from PIL import Image

    images = images[: 4 * columns]
    rows = [images[i : i + columns] for i in range(0, len(images), columns)]
    rows = [np.concatenate(list(r) + [np.zeros_like(r[0])] * (columns - len(r)), axis=1) for r in rows]
    grid = np.concatenate(rows, axis=0)
    Image.fromarray(grid).resize((grid.shape[1] * scale, grid.shape[0] * scale), Image.NEAREST).save(path)


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: ``python -m raydec.reference.janus.evaluate t2i [--prompts N] ...``."""
    parser = argparse.ArgumentParser(prog="python -m raydec.reference.janus.evaluate")
    parser.add_argument("model", choices=["t2i"], help="reference model to evaluate")
    parser.add_argument("--prompts", type=int, default=200, help="held-out prompts")
    parser.add_argument("--offset", type=int, default=0, help="first held-out seed offset")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guidance-scale", type=float, default=None, help="default: the checkpoint's")
    parser.add_argument("--temperature", type=float, default=None, help="default: the checkpoint's")
    parser.add_argument("--weights", type=Path, default=None, help="folder to load instead of the shipped one")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--round-trip", action="store_true", help="score VQ round trips of held-out ground-truth images instead"
    )
    parser.add_argument(
        "--word-sensitivity", action="store_true", help="measure how much each kind of prompt word moves the predictions"
    )
    parser.add_argument(
        "--texture",
        choices=["iid", "runs"],
        default="runs",
        help="texture of the ground-truth images --round-trip and --word-sensitivity use (the shipped model draws runs)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--grid", type=Path, default=None, help="write a PNG grid of samples here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    if args.weights is None:
        from raydec.reference.load import load

        model, processor = load(args.model)
    else:
        from transformers import JanusForConditionalGeneration, JanusProcessor

        model = JanusForConditionalGeneration.from_pretrained(args.weights, local_files_only=True).eval()
        processor = JanusProcessor.from_pretrained(args.weights, local_files_only=True)
    if args.word_sensitivity:
        sensitivity = word_sensitivity(model, processor, args.prompts, args.offset, args.texture)
        print(json.dumps(sensitivity, indent=2))
        if args.json is not None:
            args.json.write_text(json.dumps(sensitivity, indent=2))
        return
    if args.round_trip:
        result = vq_round_trip(model, args.prompts, args.offset, args.batch_size, args.texture)
        result["scores"] = []
    else:
        result = evaluate_t2i(
            model, processor, args.prompts, args.batch_size, args.seed, args.guidance_scale, args.temperature,
            args.offset,
        )
    if args.grid is not None:
        save_grid(result["_images"], args.grid)
    summary = {k: v for k, v in result.items() if not k.startswith("_") and k != "scores"}
    if args.json is not None:
        args.json.write_text(json.dumps({**summary, "scores": result["scores"]}, indent=2))
    print(json.dumps(summary, indent=2))
    key = "round_trip_judge_mean" if args.round_trip else "judge_mean"
    print(f"mean judge score: {result[key]:.4f}")


if __name__ == "__main__":
    main()
