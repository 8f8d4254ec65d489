"""What the public functions check of their inputs (each error names the argument and its
value) and how an unset decode config is filled from the checkpoint."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any, Sequence

from PIL import Image

from raydec.config import CAPTION_METHODS, DecodeConfig, SamplingConfig, parse_image_size
from raydec.models.generation_config import sampling_from_generation_config
from raydec.speculative.requests import RowRequest
from raydec.validation import text_problem

SEED_LIMIT = 2**63  # seeds are in [0, 2**63), as a job's


def check_seeds(seeds: Sequence[int] | None, count: int, rows: str) -> None:
    """One integer seed in [0, 2**63) per row, or None (each row's index)."""
    if seeds is None:
        return
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__len__"):
        raise TypeError(f"seeds must be a list of integers (one per row), got {type(seeds).__name__}: {seeds!r}")
    if len(seeds) != count:
        raise ValueError(f"seeds has {len(seeds)} entries but {rows} has {count}")
    for index, seed in enumerate(seeds):
        try:
            value = operator.index(seed)  # ints (numpy's too), not floats or strings
        except TypeError:
            raise TypeError(f"seeds[{index}] must be an integer, got {type(seed).__name__}: {seed!r}") from None
        if isinstance(seed, bool) or not 0 <= value < SEED_LIMIT:
            raise ValueError(f"seeds[{index}] must be an integer in [0, 2**63), got {seed!r}")


def as_decode_config(decode: DecodeConfig | dict | None) -> DecodeConfig | None:
    """``decode`` as a DecodeConfig: one, a dict of its fields (validated), or None."""
    if decode is None or isinstance(decode, DecodeConfig):
        return decode
    if isinstance(decode, dict):
        return DecodeConfig.model_validate(decode)
    raise TypeError(f"decode must be a raydec.config.DecodeConfig or a dict of its fields, got {type(decode).__name__}: {decode!r}")


def check_inputs(
    prompts: Sequence[str], seeds: Sequence[int] | None, negative_prompts: Sequence[str | None] | None, batch_size: int
) -> None:
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, not one string")
    if not hasattr(prompts, "__len__"):
        raise TypeError(f"prompts must be a list of strings, got {type(prompts).__name__} (wrap it in list(...))")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise TypeError(f"prompts[{index}] must be a string, got {type(prompt).__name__}: {prompt!r}")
        if not prompt.strip():
            raise ValueError(f"prompts[{index}] is empty or blank: {prompt!r}")
        check_text(prompt, f"prompts[{index}]")
    check_seeds(seeds, len(prompts), "prompts")
    if negative_prompts is not None:
        if isinstance(negative_prompts, str) or not hasattr(negative_prompts, "__len__"):
            raise TypeError(f"negative_prompts must be a list (one string or None per prompt), got {type(negative_prompts).__name__}: {negative_prompts!r}")
        if len(negative_prompts) != len(prompts):
            raise ValueError(f"negative_prompts has {len(negative_prompts)} entries but prompts has {len(prompts)}")
        for index, negative in enumerate(negative_prompts):
            if negative is not None and not isinstance(negative, str):
                raise TypeError(f"negative_prompts[{index}] must be a string or None, got {negative!r}")
            if negative is not None:
                check_text(negative, f"negative_prompts[{index}]")
    check_batch_size(batch_size)


def sized(target: Any, size: str | None, field: str = "size") -> Any:
    """``target`` making ``size`` images (``"WIDTHxHEIGHT"``; None or ``"auto"``: its own size)."""
    parsed = parse_image_size(size, field)
    if parsed is None:
        return target
    try:
        return target.with_size(*parsed)
    except ValueError as error:
        raise ValueError(str(error).replace("size:", f"{field}:", 1)) from None


def check_text(text: str, field: str) -> None:
    """A ValueError naming ``field`` when ``text`` is no text a tokenizer can read."""
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(f"{field}: {problem}")


def check_batch_size(batch_size: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an integer >= 1, got {type(batch_size).__name__}: {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def max_positions(target: Any) -> int | None:
    """The language model's ``max_position_embeddings`` (None if its config has none)."""
    config = getattr(getattr(target, "model", None), "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def check_positions(target: Any, requests: Sequence[RowRequest], streams: int) -> None:
    """An image's length is fixed: each prompt plus its image must fit the model's positions.
    (Captions stop where the positions end: ``Engine(max_positions=...)``.)"""
    limit = max_positions(target)
    if limit is None:
        return
    kinds = (False, True) if streams == 2 else (False,)
    for index, request in enumerate(requests):
        length = max(target.prompt_inputs(request.prompt, unconditional=u).length for u in kinds)
        total = length + request.max_new_tokens
        if total > limit:
            raise ValueError(
                f"prompts[{index}]: {length} prompt tokens + {request.max_new_tokens} new tokens = {total} positions, "
                f"more than the model's {limit} (max_position_embeddings); shorten it"
            )


def image_decode_config(decode: DecodeConfig | None, target: Any) -> DecodeConfig:
    """Fill what the user left unset: sampling from the checkpoint, length from the layout."""
    layout_tokens = int(target.num_image_tokens)
    if decode is None:
        return DecodeConfig(max_new_tokens=layout_tokens, sampling=target.default_sampling())
    explicit = decode.model_fields_set
    if "max_new_tokens" in explicit and decode.max_new_tokens != layout_tokens:
        raise ValueError(
            f"decode.max_new_tokens={decode.max_new_tokens}: an image of this model is exactly "
            f"{layout_tokens} tokens; leave max_new_tokens unset"
        )
    update: dict[str, Any] = {"max_new_tokens": layout_tokens}
    update["sampling"] = over_checkpoint(decode.sampling if "sampling" in explicit else None, target.default_sampling())
    return decode.model_copy(update=update)


def over_checkpoint(sampling: SamplingConfig | None, checkpoint: SamplingConfig) -> SamplingConfig:
    """The fields set in ``sampling`` over the checkpoint's sampling, as Hugging Face
    ``generate``'s keyword arguments override its generation_config (None: the checkpoint's)."""
    if sampling is None:
        return checkpoint
    return checkpoint.model_copy(update={name: getattr(sampling, name) for name in sampling.model_fields_set})


def as_image_list(item: Any, index: int) -> list[Image.Image]:
    """One row's images: a PIL image, a path, bytes, or a list of those."""
    from io import BytesIO

    from raydec.io.images import ImageError, to_rgb  # lazy: keeps pyarrow (the raydec.io package) out of import raydec.api

    items = list(item) if isinstance(item, (list, tuple)) else [item]
    if not items:
        raise ValueError(f"images[{index}] is an empty list")
    images = []
    for image in items:
        if isinstance(image, Image.Image):
            images.append(to_rgb(image, field=f"images[{index}]"))
        elif isinstance(image, (bytes, bytearray)):
            try:
                images.append(to_rgb(Image.open(BytesIO(image)), field=f"images[{index}]"))
            except ImageError:
                raise
            except Exception as error:  # PIL raises several types for corrupt data
                raise ValueError(f"images[{index}]: cannot decode image bytes ({error})") from error
        elif isinstance(image, (str, Path)):
            try:
                images.append(to_rgb(Image.open(image), field=f"images[{index}]"))
            except ImageError:
                raise
            except (OSError, ValueError, Image.DecompressionBombError) as error:
                raise ValueError(f"images[{index}]: cannot open image {str(image)!r} ({error})") from error
        else:
            raise TypeError(f"images[{index}] must be a PIL image, bytes, a path, or a list of them; got {type(image).__name__}")
    return images


def caption_decode_config(decode: DecodeConfig | None, target: Any) -> DecodeConfig:
    """Unset sampling follows the checkpoint's generation_config as its HF ``generate`` does
    (greedy unless it samples; unset fields at HF's defaults; its repetition penalty kept)."""
    def default_sampling(explicit: SamplingConfig | None = None) -> SamplingConfig:  # it warns about settings it cannot apply
        generation = getattr(target.model, "generation_config", None)
        checkpoint = sampling_from_generation_config(generation, "logits", repetition_penalty=True)
        sampling = over_checkpoint(explicit, checkpoint.model_copy(update={"cfg_scale": 1.0}))  # a VLM's guidance_scale is not CFG
        if sampling.greedy:  # top-k / top-p do not change an argmax
            sampling = sampling.model_copy(update={"top_k": 0, "top_p": 1.0})
        return sampling

    if decode is None:
        return DecodeConfig(max_new_tokens=128, sampling=default_sampling())
    if decode.method not in CAPTION_METHODS:
        raise ValueError(f"decode.method={decode.method!r} is not a captioning method (use {', '.join(CAPTION_METHODS)})")
    if decode.sampling.uses_cfg:
        raise ValueError(f"decode.sampling.cfg_scale: {decode.sampling.cfg_scale} must be 1 for captioning (no classifier-free guidance)")
    explicit = decode.sampling if "sampling" in decode.model_fields_set else None
    decode = decode.model_copy(update={"sampling": default_sampling(explicit)})
    if "max_new_tokens" not in decode.model_fields_set:
        decode = decode.model_copy(update={"max_new_tokens": 128})
    return decode
