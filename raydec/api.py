"""The small public Python API used by notebooks, jobs and the benches.

    from raydec.api import generate_images, caption_images
    results = generate_images(["a red circle on the left"], model="reference")
    results[0].image.save("out.png")
    captions = caption_images([results[0].image], model="reference",
                              decode=DecodeConfig(method="vispec"))

``load_pipeline`` loads a model once (cached per model, kind, dtype and device), so repeated
calls do not reload weights; ``generate_images`` accepts ``model`` as "reference", a local
checkpoint folder, or an already loaded target.
"""

from __future__ import annotations

import json
import logging
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image

from raydec.config import CAPTION_METHODS, DRAFT_METHODS, IMAGE_METHODS, JACOBI_METHODS, DecodeConfig, SamplingConfig
from raydec.models.image_gen import ImagePrompt
from raydec.speculative.engine import Engine, RowRequest
from raydec.speculative.proposers.base import Proposer

logger = logging.getLogger(__name__)

DEFAULT_CAPTION_PROMPT = "describe the image ."
_PIPELINES: dict[tuple[str, str, str, str], Any] = {}
# kind -> (an attribute every loaded target of that kind has, its name in errors)
_KIND_MARKERS = {"t2i": ("num_image_tokens", "text-to-image"), "vlm": ("format_prompt", "vision-language")}


@dataclass
class ImageResult:
    """One generated image and its decoding statistics.

    target_forwards: target forwards for this row (prefill included); num_tokens: generated
    tokens (layout tokens included); mean_accepted: tokens per target forward; latency_s: time
    from the row's prefill until it finished decoding (VQ decoding excluded).
    """

    image: Image.Image
    tokens: list[int]
    seed: int
    target_forwards: int
    num_tokens: int
    mean_accepted: float
    latency_s: float
    accepted_lengths: list[int] = field(default_factory=list)  # tokens committed per decode forward


# -- loading ---------------------------------------------------------------------------------


def load_pipeline(
    model: str | Path | Any = "reference", kind: str = "t2i", dtype: torch.dtype = torch.float32, device: str | None = None
) -> Any:
    """Load (once) and return the target for ``model``.

    model: "reference", a local ``from_pretrained`` folder, or an already loaded target
    (returned unchanged). kind: "t2i" (text-to-image) or "vlm" (captioning). device: e.g.
    "cuda" (None: CPU). On a CPU the linear layers compute through row-major fp32 GEMMs
    (same weights and outputs, faster for few-row windows; see ``models.cpu_matmul``).
    """
    if kind not in _KIND_MARKERS:
        raise ValueError(f"load_pipeline: unknown kind={kind!r} (use 't2i' or 'vlm')")
    _check_device(device)
    if not isinstance(model, (str, Path)):
        marker, what = _KIND_MARKERS[kind]
        if not hasattr(model, marker):
            raise ValueError(f"model: a loaded {type(model).__name__} is not a {what} target (load one with kind={kind!r})")
        return model
    from raydec.models import registry
    from raydec.models.cpu_matmul import route_if_cpu

    if kind == "t2i":
        key = (kind, str(registry.resolve_t2i_path(model).resolve()), str(dtype), str(device or "cpu"))
        if key not in _PIPELINES:
            target = registry.load_t2i_target(model, dtype=dtype)
            if device is not None:
                target.model.to(device)
            _PIPELINES[key] = target
    elif kind == "vlm":
        key = (kind, str(registry.resolve_vlm_path(model).resolve()), str(dtype), str(device or "cpu"))
        if key not in _PIPELINES:
            _PIPELINES[key] = registry.load_vlm_target(model, dtype=dtype, device=device)
    target = _PIPELINES[key]
    if not getattr(target, "cpu_matmul", False):
        target.cpu_matmul = route_if_cpu(target.model, device, dtype)
    return target


def _check_device(device: Any) -> None:
    """A device torch knows and this machine has (None: CPU)."""
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device: {device!r} is not a torch device (use 'cpu', 'cuda' or 'cuda:N'; {error})") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r}, but this torch sees no CUDA GPU (torch.cuda.is_available() is False)")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device!r}, but torch sees {torch.cuda.device_count()} GPU(s)")


def draft_dtype(target: Any, choice: str = "auto") -> torch.dtype:
    """``decode.draft_dtype`` -> the draft's torch dtype for ``target`` (see DecodeConfig)."""
    if choice == "auto":
        return target.dtype if torch.device(target.device).type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[choice]


def load_draft(
    target: Any, method: str, model: str | Path | Any = "reference", draft_model: str | Path | None = None,
    dtype: torch.dtype | None = None,
) -> Any:
    """Load (once) the ViSpec / EAGLE draft for ``target``; see ``registry.resolve_draft_path``.
    dtype: the draft's precision (None: the target's)."""
    from raydec.models.cpu_matmul import route_if_cpu
    from raydec.models.registry import resolve_draft_path
    from raydec.models.vispec_draft import CONFIG_NAME, VispecDraft, check_draft_fits

    if not isinstance(model, (str, Path)):  # a loaded target: drafts shipped next to its checkpoint
        model = getattr(target, "checkpoint_path", None)
        if model is None and draft_model is None:
            raise ValueError(f"decode.method={method!r} with a target not loaded by path needs decode.draft_model")
    path = resolve_draft_path(model or "", method, draft_model)
    key = ("draft", str(path.resolve()), str(dtype or target.dtype), str(id(target)))
    text_config = target.model.config.get_text_config()
    if key in _PIPELINES:  # checked on every call: the cache key has no method
        check_draft_fits(path, _PIPELINES[key].config, text_config, method)
        return _PIPELINES[key]
    if (path / CONFIG_NAME).is_file():  # before any weight loads (a missing file is from_pretrained's error)
        check_draft_fits(path, json.loads((path / CONFIG_NAME).read_text()), text_config, method)
    draft = VispecDraft.from_pretrained(path, target=target, dtype=dtype)
    route_if_cpu(draft.prepare_inference(), target.device, next(draft.parameters()).dtype)
    _PIPELINES[key] = draft
    return draft


# -- proposers -------------------------------------------------------------------------------


def _layout_grid(target: Any) -> tuple[int, int] | None:
    """(rows, tokens per row in generation order) of the target's layout, for spatial drafts.

    Janus: the image grid; Emu3: (h, w + 1), since every row ends with an end-of-line token.
    """
    grid = getattr(target, "layout_grid", None) or getattr(target, "grid_shape", None)
    return (int(grid[0]), int(grid[1])) if grid is not None else None


def _make_proposer(decode: DecodeConfig, target: Any, model: str | Path | Any = "reference") -> Proposer:
    """The proposer for ``decode.method`` (a fresh one per call).

    ar -> ARProposer; random -> RandomTreeProposer (dense q; a test stand-in for drafted
    methods); sjd / sjd_ac / sjd_pac -> ``spec.proposers.jacobi.JacobiProposer`` when that module
    is present, with fresh drafts from ``decode.draft.init`` when the config has that field
    (else "uniform") and the layout's row stride for the "above" prior.
    """
    method = decode.method
    if method == "ar":
        from raydec.speculative.proposers.ar import ARProposer

        return ARProposer()
    if method == "random":
        from raydec.speculative.proposers.random_tree import RandomTreeProposer

        return RandomTreeProposer(decode.draft, "dense")
    if method in JACOBI_METHODS:
        from raydec.speculative.proposers.jacobi import JacobiProposer

        grid = _layout_grid(target)
        return JacobiProposer(decode.draft, variant=method, init=decode.draft.init, grid_width=grid[1] if grid else None)
    if method in DRAFT_METHODS:
        from raydec.speculative.proposers.draft_tree import DraftTreeProposer

        draft = load_draft(target, method, model, decode.draft_model, dtype=draft_dtype(target, decode.draft_dtype))
        return DraftTreeProposer(draft, decode.tree)
    raise ValueError(f"decode.method={method!r} has no proposer here")


# -- validation ------------------------------------------------------------------------------


SEED_LIMIT = 2**63  # seeds are in [0, 2**63), as a job's


def _check_seeds(seeds: Sequence[int] | None, count: int, rows: str) -> None:
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


def _as_decode_config(decode: DecodeConfig | dict | None) -> DecodeConfig | None:
    """``decode`` as a DecodeConfig: one, a dict of its fields (validated), or None."""
    if decode is None or isinstance(decode, DecodeConfig):
        return decode
    if isinstance(decode, dict):
        return DecodeConfig.model_validate(decode)
    raise TypeError(f"decode must be a raydec.config.DecodeConfig or a dict of its fields, got {type(decode).__name__}: {decode!r}")


def _check_inputs(
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
    _check_seeds(seeds, len(prompts), "prompts")
    if negative_prompts is not None:
        if isinstance(negative_prompts, str) or not hasattr(negative_prompts, "__len__"):
            raise TypeError(f"negative_prompts must be a list (one string or None per prompt), got {type(negative_prompts).__name__}: {negative_prompts!r}")
        if len(negative_prompts) != len(prompts):
            raise ValueError(f"negative_prompts has {len(negative_prompts)} entries but prompts has {len(prompts)}")
        for index, negative in enumerate(negative_prompts):
            if negative is not None and not isinstance(negative, str):
                raise TypeError(f"negative_prompts[{index}] must be a string or None, got {negative!r}")
    _check_batch_size(batch_size)


def _check_batch_size(batch_size: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an integer >= 1, got {type(batch_size).__name__}: {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def _max_positions(target: Any) -> int | None:
    """The language model's ``max_position_embeddings`` (None if its config has none)."""
    config = getattr(getattr(target, "model", None), "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def _check_positions(target: Any, requests: Sequence[RowRequest], streams: int) -> None:
    """An image's length is fixed: each prompt plus its image must fit the model's positions.
    (Captions stop where the positions end: ``Engine(max_positions=...)``.)"""
    limit = _max_positions(target)
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


def _image_decode_config(decode: DecodeConfig | None, target: Any) -> DecodeConfig:
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


# -- generation ------------------------------------------------------------------------------


def continuous_batching(device: Any, batching: str = "auto") -> bool:
    """Whether batched decoding on ``device`` gives a finished row's place to the next request
    (``DecodeConfig.batching``: "continuous", "consecutive", or "auto" to decide by device).

    On an accelerator a decode step costs about the same for 1 or ``batch_size`` rows, so a
    finished row's place goes to the next request (continuous batching) instead of the batch
    draining to its slowest row; drafted rows finish many steps apart. On a CPU a step costs
    in proportion to its rows, so a draining batch already gets cheaper and refilling only
    adds prefills and cache copies (measured: no gain at batch 8 on the reference Janus):
    there, "auto" runs requests in consecutive batches.
    """
    if batching == "auto":
        return torch.device(device).type != "cpu"
    if batching not in ("continuous", "consecutive"):
        raise ValueError(f"batching: expected 'auto', 'continuous' or 'consecutive', got {batching!r}")
    return batching == "continuous"


def _decode_batches(engine: Engine, requests: list[RowRequest], batch_size: int, continuous: bool, on_finish: Callable[[int, Any], None]) -> list[Any]:
    """Decode ``requests`` at most ``batch_size`` rows at a time: continuously batched, or in
    consecutive batches."""
    if continuous:
        return engine.generate(requests, max_batch=batch_size, on_finish=on_finish)
    outputs = []
    for start in range(0, len(requests), batch_size):
        outputs += engine.generate(requests[start : start + batch_size], on_finish=lambda i, out: on_finish(start + i, out))
    return outputs


def _progress(bar: Any, total: int, what: str) -> Callable[[int, Any], None]:
    """An ``Engine.generate`` on_finish callback: advances the progress bar and, for runs of 20
    rows or more, logs each tenth."""
    done = 0
    every = max(1, total // 10)

    def on_finish(_index: int, output: Any) -> None:
        nonlocal done
        done += 1
        if bar is not None:
            bar.update(1)
        if total >= 20 and (done % every == 0 or done == total):
            logger.info("%s: %d/%d finished (last: %.2f tokens per forward)", what, done, total, output.stats.tokens_per_forward)

    return on_finish


def generate_images(
    prompts: Sequence[str],
    model: str | Path | Any = "reference",
    decode: DecodeConfig | dict | None = None,
    seeds: Sequence[int] | None = None,
    negative_prompts: Sequence[str | None] | None = None,
    batch_size: int = 8,
    progress: bool = False,
) -> list[ImageResult]:
    """Generate one image per prompt.

    model: "reference", a local checkpoint folder, or a target from ``load_pipeline``.
    decode: method and sampling (a DecodeConfig, or a dict of its fields); unset ``sampling``
    takes the checkpoint's generation_config, and the length is always the model's image layout.
    The fields you set in ``sampling`` override the checkpoint's, one by one, as keyword
    arguments of HF ``generate`` override its generation_config (``sampling={"temperature": 1.0}``
    keeps the checkpoint's CFG scale and top-k).
    seeds: one per prompt, integers in [0, 2**63) (default: the prompt's index); a row's image
    depends only on its prompt, seed and config, never on the batch. negative_prompts: per
    prompt (None entries allowed), the CFG unconditional text.
    """
    _check_inputs(prompts, seeds, negative_prompts, batch_size)
    decode = _as_decode_config(decode)
    if len(prompts) == 0:
        return []
    target = load_pipeline(model, kind="t2i")
    config = _image_decode_config(decode, target)
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
    _check_positions(target, requests, 2 if config.sampling.uses_cfg else 1)
    results: list[ImageResult] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(requests), desc=f"generate_images ({config.method})", unit="image")
    try:
        engine = Engine(
            target, _make_proposer(config, target), config,
            constraint=target.vocab_constraint(), eos_token_ids=target.eos_token_ids,
        )
        continuous = continuous_batching(target.device, config.batching)
        outputs = _decode_batches(engine, requests, batch_size, continuous, _progress(bar, len(requests), f"generate_images ({config.method})"))
        for start in range(0, len(requests), batch_size):
            batch, chunk = requests[start : start + batch_size], outputs[start : start + batch_size]
            images = target.decode_tokens(torch.tensor([output.tokens for output in chunk], dtype=torch.long))
            for request, output, image in zip(batch, chunk, images):
                results.append(
                    ImageResult(
                        image=image,
                        tokens=list(output.tokens),
                        seed=request.seed,
                        target_forwards=output.stats.target_forwards,
                        num_tokens=len(output.tokens),
                        mean_accepted=output.stats.tokens_per_forward,
                        latency_s=output.stats.wall_time_s,
                        accepted_lengths=list(output.stats.accepted_lengths),
                    )
                )
    finally:
        if bar is not None:
            bar.close()
    return results


# -- captioning ------------------------------------------------------------------------------


@dataclass
class CaptionResult:
    """One caption and its decoding statistics (fields as in ``ImageResult``).

    tau: accepted draft tokens per verification, without the bonus token (mean_accepted - 1
    over decode forwards); finish_reason: "eos" or "length".
    """

    caption: str
    tokens: list[int]
    seed: int
    target_forwards: int
    num_tokens: int
    mean_accepted: float
    tau: float
    latency_s: float
    finish_reason: str
    accepted_lengths: list[int] = field(default_factory=list)


def _as_image_list(item: Any, index: int) -> list[Image.Image]:
    """One row's images: a PIL image, a path, bytes, or a list of those."""
    from io import BytesIO

    from raydec.io.images import ImageError, to_rgb

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


def _caption_decode_config(decode: DecodeConfig | None, target: Any) -> DecodeConfig:
    """Unset sampling follows the checkpoint's generation_config as its HF ``generate`` does
    (greedy unless it samples; unset fields at HF's defaults; its repetition penalty kept)."""
    from raydec.models.generation_config import sampling_from_generation_config

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
    LLaVA / LLaVA-NeXT / Qwen2-VL / Qwen2.5-VL folder, or a target from ``load_pipeline``.
    decode (a DecodeConfig, or a dict of its fields): method ar | vispec | eagle
    (``decode.draft_model`` names the draft; the reference VLM ships its own), sampling (unset:
    the checkpoint's generation_config, resolved as its HF ``generate`` does; fields you set
    override it one by one), max_new_tokens (unset: 128). seeds: one per image,
    integers in [0, 2**63). A row's caption depends only on its inputs, seed and config.
    """
    from raydec.models.hf_vlm import VlmPrompt

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
    _check_seeds(seeds, len(images), "images")
    decode = _as_decode_config(decode)
    _check_batch_size(batch_size)
    if len(images) == 0:
        return []
    rows = [_as_image_list(item, i) for i, item in enumerate(images)]
    target = load_pipeline(model, kind="vlm")
    config = _caption_decode_config(decode, target)
    seeds = list(seeds) if seeds is not None else list(range(len(images)))
    requests = [
        RowRequest(VlmPrompt(target.format_prompt(q, len(imgs)), imgs), seed=int(seed), max_new_tokens=config.max_new_tokens)
        for q, imgs, seed in zip(questions, rows, seeds)
    ]
    tokenizer = getattr(target.processor, "tokenizer", target.processor)
    eos = set(target.eos_token_ids)
    results: list[CaptionResult] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(requests), desc=f"caption_images ({config.method})", unit="image")
    try:
        engine = Engine(target, _make_proposer(config, target, model), config, eos_token_ids=target.eos_token_ids,
                        max_positions=_max_positions(target))
        continuous = continuous_batching(target.device, config.batching)
        outputs = _decode_batches(engine, requests, batch_size, continuous, _progress(bar, len(requests), f"caption_images ({config.method})"))
        for request, output in zip(requests, outputs):
            text_tokens = [t for t in output.tokens if t not in eos]
            lengths = output.stats.accepted_lengths
            results.append(
                CaptionResult(
                    caption=tokenizer.decode(text_tokens, skip_special_tokens=True).strip(),
                    tokens=list(output.tokens),
                    seed=request.seed,
                    target_forwards=output.stats.target_forwards,
                    num_tokens=len(output.tokens),
                    mean_accepted=output.stats.tokens_per_forward,
                    tau=(sum(lengths) - len(lengths)) / max(1, len(lengths)),
                    latency_s=output.stats.wall_time_s,
                    finish_reason=output.stats.finish_reason,
                    accepted_lengths=list(lengths),
                )
            )
    finally:
        if bar is not None:
            bar.close()
    return results
