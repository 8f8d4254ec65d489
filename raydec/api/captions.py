"""``caption_images``: image captioning and visual questions with any caption method (ar,
vispec, eagle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from PIL import Image

from raydec.api.batching import continuous_batching, decode_batches, progress_callback
from raydec.api.inputs import (
    as_decode_config, as_image_list, caption_decode_config, check_batch_size, check_seeds, check_text, max_positions,
)
from raydec.api.plan import CallCalibration, plan_decode
from raydec.config import DRAFT_METHODS, DecodeConfig
from raydec.models.loading import draft_dtype, load_draft_model, load_target
from raydec.models.registry import resolve_draft_path
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowOutput, RowRequest
from raydec.speculative.proposers.factory import make_proposer

DEFAULT_CAPTION_PROMPT = "describe the image ."


@dataclass
class CaptionResult:
    """One caption and its decoding statistics (fields as in ``ImageResult``).

    tau: accepted draft tokens per verification, without the bonus token (tokens_per_forward - 1
    over decode forwards); finish_reason: "eos" or "length"; method: the method the row was decoded
    with ("ar" where an "auto" draft tree chose plain AR).
    """

    caption: str
    tokens: list[int]
    seed: int
    target_forwards: int
    num_tokens: int
    tokens_per_forward: float
    tau: float
    latency_s: float
    finish_reason: str
    accepted_lengths: list[int] = field(default_factory=list)
    method: str = ""
    plan: str = ""  # the method and draft shape the row was decoded with (``DecodePlan.label``)


def draft_folder(model: Any, target: Any, config: DecodeConfig) -> str | None:
    """The folder of the draft ``config`` decodes with (its weights are part of a tuned shape's key), if known."""
    if config.method not in DRAFT_METHODS:
        return None
    if config.draft_model is not None:
        return config.draft_model

    source = model if isinstance(model, (str, Path)) else getattr(getattr(target, "model", None), "name_or_path", None)
    try:
        return str(resolve_draft_path(source, config.method, None)) if source else None
    except (FileNotFoundError, ValueError):
        return None


def caption_text(target: Any, tokens: Sequence[int]) -> str:
    """Generated tokens -> the caption (EOS and special tokens dropped, ends stripped)."""
    tokenizer = getattr(target.processor, "tokenizer", target.processor)
    eos = set(target.eos_token_ids)
    return tokenizer.decode([t for t in tokens if t not in eos], skip_special_tokens=True).strip()


def caption_result(request: RowRequest, output: RowOutput, caption: str, method: str, finish_reason: str | None = None,
                   plan: str = "") -> CaptionResult:
    """A finished row, decoded with ``method``, as the public result (finish_reason: the engine's unless given)."""
    lengths = output.stats.accepted_lengths
    return CaptionResult(
        caption=caption,
        tokens=list(output.tokens),
        seed=request.seed,
        target_forwards=output.stats.target_forwards,
        num_tokens=len(output.tokens),
        tokens_per_forward=output.stats.tokens_per_forward,
        tau=(sum(lengths) - len(lengths)) / max(1, len(lengths)),
        latency_s=output.stats.wall_time_s,
        finish_reason=finish_reason or output.stats.finish_reason,
        accepted_lengths=list(lengths),
        method=method,
        plan=plan or method,
    )


def caption_images(
    images: Sequence[Any],
    prompt: str | Sequence[str] = DEFAULT_CAPTION_PROMPT,
    model: str | Path | Any = "reference",
    decode: DecodeConfig | dict | None = None,
    seeds: Sequence[int] | None = None,
    batch_size: int = 8,
    progress: bool = False,
) -> list[CaptionResult]:
    """Caption (or answer a question about) each image with a vision-language model.

    images: per row a PIL image, image bytes, a path, or a list of them (several images in one
    prompt). prompt: one question for every row or one per row. model: "reference", a local
    LLaVA / LLaVA-NeXT / Qwen2-VL / Qwen2.5-VL / Qwen3-VL folder, or a target from ``load_target``.
    decode (a DecodeConfig, or a dict of its fields): method ar | vispec | eagle
    (``decode.draft_model`` names the draft; the reference VLM ships its own), sampling (unset:
    the checkpoint's generation_config, resolved as its HF ``generate`` does; fields you set
    override it one by one), max_new_tokens (unset: 128). seeds: one per image,
    integers in [0, 2**63). A row's caption depends only on its inputs, seed and config.
    """
    from raydec.models.hf_vlm import VlmPrompt  # lazy: VLM model code (transformers, ~2 s) loads only for captioning

    if isinstance(images, (str, bytes, Image.Image)):
        raise TypeError("images must be a list (one entry per row)")
    if not isinstance(prompt, (str, list, tuple)):
        raise TypeError(f"prompt must be a string or a list of strings (one per row), got {type(prompt).__name__}")
    questions = [prompt] * len(images) if isinstance(prompt, str) else list(prompt)
    if len(questions) != len(images):
        raise ValueError(f"prompt has {len(questions)} entries but images has {len(images)}")
    for index, question in enumerate(questions):
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"prompt[{index}] must be a non-empty string, got {question!r}")
        check_text(question, f"prompt[{index}]")
    check_seeds(seeds, len(images), "images")
    decode = as_decode_config(decode)
    check_batch_size(batch_size)
    if len(images) == 0:
        return []
    rows = [as_image_list(item, i) for i, item in enumerate(images)]
    target = load_target(model, task="caption")
    config = caption_decode_config(decode, target)
    seeds = list(seeds) if seeds is not None else list(range(len(images)))
    requests = [
        RowRequest(VlmPrompt(target.format_prompt(q, len(imgs)), imgs), seed=int(seed), max_new_tokens=config.max_new_tokens)
        for q, imgs, seed in zip(questions, rows, seeds)
    ]
    def calibrate(candidate: DecodeConfig, batch: int, picked: list[int]) -> None:  # an "auto" shape is tuned on the call's first rows
        caption_images([rows[i] for i in picked], prompt=[questions[i] for i in picked], model=target, decode=candidate,
                       seeds=[seeds[i] for i in picked], batch_size=batch)

    plan = plan_decode(config, batch_size, CallCalibration(target, len(rows), calibrate, config.compile, draft_folder(model, target, config)))
    config = plan.decode
    results: list[CaptionResult] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(requests), desc=f"caption_images ({config.method})", unit="image")
    try:
        draft_model = None
        if config.method in DRAFT_METHODS:
            draft_model = load_draft_model(target, config.method, model, config.draft_model, dtype=draft_dtype(target, config.draft_dtype))
        engine = Engine(target, make_proposer(config, target, draft_model), config.sampling, config.max_new_tokens, compaction=config.compaction, compile=config.compile, coupling=config.coupling, eos_token_ids=target.eos_token_ids,
                        max_positions=max_positions(target))
        continuous = continuous_batching(target.device, config.batching)
        outputs = decode_batches(engine, requests, batch_size, continuous, progress_callback(bar, len(requests), f"caption_images ({config.method})"))
        results += [caption_result(request, output, caption_text(target, output.tokens), config.method, plan=plan.label)
                    for request, output in zip(requests, outputs)]
    finally:
        if bar is not None:
            bar.close()
    return results
