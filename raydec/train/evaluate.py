"""Acceptance of trained draft models: ``caption_images`` greedy on held-out images (shapes-world
seeds, or the first rows of ``evaluate.images``).

Per method: tokens per target forward (all generated tokens over all target forwards, the
prefill included, and the mean of the per-row values), tau (accepted draft tokens per
verification, without the bonus token), wall time, and whether the captions equal AR's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from raydec.api import caption_images, load_target
from raydec.config import DecodeConfig, SamplingConfig
from raydec.io.datasets import iter_validated_batches
from raydec.io.images import attach_caption_images
from raydec.train.config import EvalConfig
from raydec.train.datagen import ImageSource

logger = logging.getLogger(__name__)


def evaluation_images(config: EvalConfig, image_source: ImageSource) -> tuple[list[int], list[Any], list[str]]:
    """The seeds, images and prompts acceptance is measured on: the first ``num_images`` readable
    rows of ``config.images`` (read here: an evaluation set is small), else held-out shapes-world seeds."""
    if config.images is None:
        seeds = list(range(config.seed_start, config.seed_start + config.num_images))
        return seeds, image_source(seeds), [config.prompt] * len(seeds)

    s3 = config.images.s3.resolved()
    seeds, images, prompts = [], [], []
    for batch in iter_validated_batches(config.images.model_copy(update={"s3": s3}), "caption", batch_rows=config.num_images):
        for row in attach_caption_images([r for r in batch if not r["error"]], s3):
            if not row["error"] and len(images) < config.num_images:
                seeds.append(int(row["seed"]))
                images.append(row["pil_image"])
                prompts.append(row["prompt"] or config.prompt)
        if len(images) >= config.num_images:
            break
    if not images:
        raise ValueError(f"evaluate.images: no readable image in {config.images.path}")
    return seeds, images, prompts


def measure_acceptance(
    target: Any, draft_folders: dict[str, str | Path], config: EvalConfig, image_source: ImageSource
) -> dict[str, dict[str, Any]]:
    """draft_folders: method (vispec | eagle) -> draft model folder. Methods without one are skipped
    (except ar). image_source: the evaluation seeds' images. Returns method -> statistics."""
    torch.set_num_threads(config.threads)
    target = load_target(target, task="caption")
    seeds, images, prompts = evaluation_images(config, image_source)
    report: dict[str, dict[str, Any]] = {}
    reference_tokens = None
    for method in config.methods:
        if method != "ar" and method not in draft_folders:
            continue
        decode = DecodeConfig(
            method=method, max_new_tokens=config.max_new_tokens, sampling=SamplingConfig(temperature=0.0),
            draft_tree=config.draft_tree, draft_model=str(draft_folders[method]) if method != "ar" else None,
        )
        start = time.time()
        results = caption_images(images, prompt=prompts, model=target, decode=decode, seeds=seeds,
                                 batch_size=config.batch_size)
        wall = time.time() - start
        tokens = sum(r.num_tokens for r in results)
        forwards = sum(r.target_forwards for r in results)
        lengths = [n for r in results for n in r.accepted_lengths]
        outputs = [r.tokens for r in results]
        if method == "ar":
            reference_tokens = outputs
        report[method] = {
            "tokens_per_forward": tokens / max(1, forwards),
            "mean_row_tokens_per_forward": sum(r.tokens_per_forward for r in results) / len(results),
            "tau": (sum(lengths) - len(lengths)) / max(1, len(lengths)),
            "tokens": tokens, "target_forwards": forwards, "wall_s": round(wall, 2),
            "same_as_ar": None if reference_tokens is None else outputs == reference_tokens,
        }
        logger.info("%s: %.3f tokens per target forward (%s)", method, report[method]["tokens_per_forward"], report[method])
    return report
