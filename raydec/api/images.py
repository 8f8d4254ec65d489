"""``generate_images``: text-to-image with any image method (ar, sjd, sjd_ac, sjd_pac)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from raydec.api.batching import continuous_batching, decode_batches, progress_callback
from raydec.api.inputs import as_decode_config, check_inputs, check_positions, image_decode_config, sized
from raydec.api.plan import CallCalibration, plan_decode
from raydec.config import IMAGE_METHODS, DecodeConfig
from raydec.models.image_gen import ImagePrompt
from raydec.models.loading import load_target
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowOutput, RowRequest
from raydec.speculative.proposers.factory import make_proposer

logger = logging.getLogger("raydec.api")


@dataclass
class ImageResult:
    """One generated image and its decoding statistics.

    target_forwards: target forwards for this row (prefill included); num_tokens: generated
    tokens (layout tokens included); tokens_per_forward: tokens per target forward; latency_s: time
    from the row's prefill until it finished decoding (VQ decoding excluded).
    """

    image: Image.Image
    tokens: list[int]
    seed: int
    target_forwards: int
    num_tokens: int
    tokens_per_forward: float
    latency_s: float
    accepted_lengths: list[int] = field(default_factory=list)  # tokens committed per decode forward
    method: str = ""
    plan: str = ""  # the method and draft shape the row was decoded with (``DecodePlan.label``)


def decode_image(target: Any, tokens: Sequence[int]) -> Image.Image:
    """One row's tokens -> its image. Decoded alone: a batched VQ decode rounds a row's pixels
    differently with different neighbours (measured: off by 1 in float32), and a row's image
    must not depend on its batch."""
    return target.decode_tokens(torch.tensor([list(tokens)], dtype=torch.long))[0]


def image_result(request: RowRequest, output: RowOutput, image: Image.Image, method: str, plan: str = "") -> ImageResult:
    """A finished row, decoded with ``method`` (as ``plan`` labels it), as the public result."""
    return ImageResult(
        image=image,
        tokens=list(output.tokens),
        seed=request.seed,
        target_forwards=output.stats.target_forwards,
        num_tokens=len(output.tokens),
        tokens_per_forward=output.stats.tokens_per_forward,
        latency_s=output.stats.wall_time_s,
        accepted_lengths=list(output.stats.accepted_lengths),
        method=method,
        plan=plan or method,
    )


def generate_images(
    prompts: Sequence[str],
    model: str | Path | Any = "reference",
    decode: DecodeConfig | dict | None = None,
    seeds: Sequence[int] | None = None,
    negative_prompts: Sequence[str | None] | None = None,
    batch_size: int = 8,
    progress: bool = False,
    size: str | None = None,
) -> list[ImageResult]:
    """Generate one image per prompt.

    model: "reference", a local checkpoint folder, or a target from ``load_target``.
    decode: method and sampling (a DecodeConfig, or a dict of its fields); unset ``sampling``
    takes the checkpoint's generation_config, and the length is always the model's image layout.
    The fields you set in ``sampling`` override the checkpoint's, one by one, as keyword
    arguments of HF ``generate`` override its generation_config (``sampling={"temperature": 1.0}``
    keeps the checkpoint's CFG scale and top-k).
    seeds: one per prompt, integers in [0, 2**63) (default: the prompt's index); a row's image
    depends only on its prompt, seed and config, never on the batch. negative_prompts: per
    prompt (None entries allowed), the CFG unconditional text. size: ``"WIDTHxHEIGHT"`` in
    pixels for a model that makes several sizes (Emu3, Lumina-mGPT); None or ``"auto"``: the model's own. A
    size the model cannot make is a ValueError naming the sizes it can.
    """
    check_inputs(prompts, seeds, negative_prompts, batch_size)
    decode = as_decode_config(decode)
    if len(prompts) == 0:
        return []
    target = sized(load_target(model, task="t2i"), size)
    config = image_decode_config(decode, target)
    if config.method not in IMAGE_METHODS:
        raise ValueError(f"decode.method={config.method!r} is not a text-to-image method (use {', '.join(IMAGE_METHODS)})")
    if negative_prompts is not None and not config.sampling.uses_cfg:
        logger.warning("negative_prompts given but cfg_scale=1 (no CFG): they are ignored")
    seeds = list(seeds) if seeds is not None else list(range(len(prompts)))
    negatives = list(negative_prompts) if negative_prompts is not None else [None] * len(prompts)
    requests = [
        RowRequest(ImagePrompt(text, negative), seed=int(seed), max_new_tokens=config.max_new_tokens)
        for text, seed, negative in zip(prompts, seeds, negatives)
    ]
    check_positions(target, requests, 2 if config.sampling.uses_cfg else 1)
    def calibrate(candidate: DecodeConfig, batch: int, rows: list[int]) -> None:  # an "auto" shape is tuned on the call's first rows
        generate_images([prompts[i] for i in rows], model=target, decode=candidate, seeds=[seeds[i] for i in rows],
                        negative_prompts=[negatives[i] for i in rows] if negative_prompts is not None else None, batch_size=batch)

    plan = plan_decode(config, batch_size, CallCalibration(target, len(prompts), calibrate, config.compile))
    config = plan.decode
    results: list[ImageResult] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(requests), desc=f"generate_images ({config.method})", unit="image")
    try:
        engine = Engine(
            target, make_proposer(config, target), config.sampling, config.max_new_tokens, compaction=config.compaction, compile=config.compile, coupling=config.coupling,
            constraint=target.vocab_constraint(), eos_token_ids=target.eos_token_ids,
        )
        continuous = continuous_batching(target.device, config.batching)
        outputs = decode_batches(engine, requests, batch_size, continuous, progress_callback(bar, len(requests), f"generate_images ({config.method})"))
        for request, output in zip(requests, outputs):
            results.append(image_result(request, output, decode_image(target, output.tokens), config.method, plan.label))
    finally:
        if bar is not None:
            bar.close()
    return results
