"""Loading targets and draft models by path, once: a cache keyed by model, task, dtype and device, so
repeated calls (a notebook, a job's actor, a bench) do not reload weights.

    target = load_target("reference", task="t2i")       # or a local folder, "org/name[@revision]", "s3://bucket/prefix"
    draft_model = load_draft_model(target, "vispec", "reference")        # the draft model shipped beside it
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from raydec.models import registry
from raydec.models.cpu_matmul import route_if_cpu
from raydec.models.registry import resolve_draft_path
from raydec.models.sources import model_folder

if TYPE_CHECKING:
    from raydec.io.config import S3Config

_LOADED: dict[tuple, Any] = {}
# task -> (an attribute every loaded target for that task has, its name in errors)
_TASK_MARKERS = {"t2i": ("num_image_tokens", "text-to-image"), "caption": ("format_prompt", "vision-language")}


def load_target(
    model: str | Path | Any = "reference", task: str = "t2i", dtype: torch.dtype = torch.float32, device: str | None = None,
    vqgan_path: str | Path | None = None, s3: Optional["S3Config"] = None,
) -> Any:
    """Load (once) and return the target for ``model``.

    model: "reference", a local ``from_pretrained`` folder, a Hugging Face hub id (``org/name``, or
    ``org/name@revision``), an ``s3://bucket/prefix`` (fetched into this node's cache once, read with
    ``s3``: None takes the AWS environment), or an already loaded target (returned unchanged). task: "t2i" (text-to-image) or "caption" (a vision-language model). device: e.g.
    "cuda" (None: CPU). vqgan_path: a Lumina-mGPT / Chameleon checkpoint's VQ-GAN folder (``vqgan.yaml``,
    ``vqgan.ckpt``) when it is not ``vqgan/`` inside the checkpoint folder. On a CPU the linear layers compute through row-major fp32 GEMMs
    (same weights and outputs, faster for few-row windows; see ``models.cpu_matmul``).
    """
    if task not in _TASK_MARKERS:
        raise ValueError(f"load_target: unknown task={task!r} (use 't2i' or 'caption')")
    check_device(device)
    if not isinstance(model, (str, Path)):
        marker, what = _TASK_MARKERS[task]
        if not hasattr(model, marker):
            raise ValueError(f"model: a loaded {type(model).__name__} is not a {what} target (load one with task={task!r})")
        return model

    if task == "t2i":
        folder = registry.resolve_t2i_path(model, s3=s3)
        vqgan = model_folder(vqgan_path, s3=s3, field="vqgan_path") if vqgan_path is not None else None
        key = (task, str(folder.resolve()), str(dtype), str(device or "cpu"), str(vqgan.resolve()) if vqgan else None)
        if key not in _LOADED:
            target = registry.load_t2i_target(folder, dtype=dtype, vqgan_path=vqgan)
            if device is not None:
                target.model.to(device)
            _LOADED[key] = target
    elif vqgan_path is not None:
        raise ValueError(f"vqgan_path: {str(vqgan_path)!r} is set, but only text-to-image models decode images (task {task!r})")
    elif task == "caption":
        folder = registry.resolve_vlm_path(model, s3=s3)
        key = (task, str(folder.resolve()), str(dtype), str(device or "cpu"))
        if key not in _LOADED:
            _LOADED[key] = registry.load_vlm_target(folder, dtype=dtype, device=device)
    target = _LOADED[key]
    if not getattr(target, "cpu_matmul", False):
        target.cpu_matmul = route_if_cpu(target.model, device, dtype)
    return target


def check_device(device: Any) -> None:
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
    """``decode.draft_dtype`` -> the draft model's torch dtype for ``target`` (see DecodeConfig)."""
    if choice == "auto":
        return target.dtype if torch.device(target.device).type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[choice]


def load_draft_model(
    target: Any, method: str, model: str | Path | Any = "reference", draft_model: str | Path | None = None,
    dtype: torch.dtype | None = None, s3: Optional["S3Config"] = None,
) -> Any:
    """Load (once) the ViSpec / EAGLE draft model for ``target``; see ``registry.resolve_draft_path``
    (``draft_model``: a folder, hub id or ``s3://`` prefix, read with ``s3``).
    dtype: the draft model's precision (None: the target's)."""
    from raydec.models.vispec_draft import CONFIG_NAME, VispecDraft, check_draft_fits  # lazy: draft model code (~2 s) loads with one

    if not isinstance(model, (str, Path)):  # a loaded target: draft models shipped next to its checkpoint
        model = getattr(target, "checkpoint_path", None)
        if model is None and draft_model is None:
            raise ValueError(f"decode.method={method!r} with a target not loaded by path needs decode.draft_model")
    path = resolve_draft_path(model or "", method, draft_model, s3=s3)
    key = ("draft", str(path.resolve()), str(dtype or target.dtype), str(id(target)))
    text_config = target.model.config.get_text_config()
    if key in _LOADED:  # checked on every call: the cache key has no method
        check_draft_fits(path, _LOADED[key].config, text_config, method)
        return _LOADED[key]
    if (path / CONFIG_NAME).is_file():  # before any weight loads (a missing file is from_pretrained's error)
        check_draft_fits(path, json.loads((path / CONFIG_NAME).read_text()), text_config, method)
    loaded = VispecDraft.from_pretrained(path, target=target, dtype=dtype)
    route_if_cpu(loaded.prepare_inference(), target.device, next(loaded.parameters()).dtype)
    _LOADED[key] = loaded
    return loaded
