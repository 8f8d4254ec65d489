"""Pick the text-to-image adapter for a checkpoint folder by its ``config.model_type``.

``load_t2i_target("reference")`` loads the shipped reference model
(``raydec/reference/weights/t2i``); any other string or path is a local ``from_pretrained``
folder (Janus / Janus-Pro -> ``JanusT2ITarget``, Emu3 -> ``Emu3T2ITarget``, Lumina-mGPT and
other Chameleon checkpoints -> ``ChameleonT2ITarget``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

import torch

from raydec.models.base import CheckpointError
from raydec.models.vqgan import CONFIG_NAME, VQGanConfig

logger = logging.getLogger(__name__)

REFERENCE_NAME = "reference"
REFERENCE_T2I_DIR = Path(__file__).resolve().parent.parent / "reference" / "weights" / "t2i"


def _load_janus(path: Path, dtype: torch.dtype, **kwargs: Any) -> Any:
    from raydec.models.janus import JanusT2ITarget  # lazy: a family's model code loads only for its checkpoints

    return JanusT2ITarget.from_pretrained(path, dtype=dtype, **kwargs)


def _load_emu3(path: Path, dtype: torch.dtype, **kwargs: Any) -> Any:
    from raydec.models.emu3 import Emu3T2ITarget  # lazy: a family's model code loads only for its checkpoints

    return Emu3T2ITarget.from_pretrained(path, dtype=dtype, **kwargs)


def _load_chameleon(path: Path, dtype: torch.dtype, **kwargs: Any) -> Any:
    from raydec.models.chameleon import ChameleonT2ITarget  # lazy: a family's model code loads only for its checkpoints

    return ChameleonT2ITarget.from_pretrained(path, dtype=dtype, **kwargs)


#: config.model_type -> loader(path, dtype, **adapter kwargs)
T2I_LOADERS: dict[str, Callable[..., Any]] = {"janus": _load_janus, "emu3": _load_emu3, "chameleon": _load_chameleon}


def _janus_size_problem(path: Path, config: Any, width: int, height: int) -> str | None:
    from raydec.models.janus import janus_size_problem  # lazy: a family's model code loads only for its checkpoints

    return janus_size_problem(config, width, height)


def _emu3_size_problem(path: Path, config: Any, width: int, height: int) -> str | None:
    from raydec.models.emu3 import emu3_size_problem  # lazy: a family's model code loads only for its checkpoints

    return emu3_size_problem(config, width, height)


def _chameleon_size_problem(path: Path, config: Any, width: int, height: int, vqgan_path: Path | None = None) -> str | None:
    from raydec.models.chameleon import chameleon_size_problem  # lazy: a family's model code loads only for its checkpoints

    vqgan = (vqgan_path or path / "vqgan") / CONFIG_NAME  # the decoder: its own folder, else the one beside the checkpoint
    pixels = VQGanConfig.from_yaml(vqgan).pixels_per_code if vqgan.is_file() else VQGanConfig().pixels_per_code
    return chameleon_size_problem(pixels, width, height)


#: config.model_type -> why a checkpoint (its folder and config) cannot make a size (None: it can)
T2I_SIZE_PROBLEMS: dict[str, Callable[[Path, Any, int, int], str | None]] = {
    "janus": _janus_size_problem, "emu3": _emu3_size_problem, "chameleon": _chameleon_size_problem,
}


def t2i_size_problem(model: str | Path, width: int, height: int, vqgan_path: str | Path | None = None) -> str | None:
    """Why the text-to-image checkpoint ``model`` cannot make ``width`` x ``height`` images, from
    its config alone (no weights load), or None. The positions a size needs are checked where it
    decodes."""
    from transformers import AutoConfig

    path = resolve_t2i_path(model)
    model_type = checkpoint_model_type(path)
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    if model_type == "chameleon":
        return _chameleon_size_problem(path, config, width, height, Path(vqgan_path) if vqgan_path else None)
    return T2I_SIZE_PROBLEMS[model_type](path, config, width, height) if model_type in T2I_SIZE_PROBLEMS else None


def check_vqgan_path(model: str | Path, vqgan_path: str | Path | None) -> None:
    """A ``vqgan_path`` only for a checkpoint that decodes with a separate VQ-GAN (Chameleon /
    Lumina-mGPT), naming a folder that holds one (a ValueError naming the field otherwise)."""
    if vqgan_path is None:
        return

    path = resolve_t2i_path(model)
    model_type = checkpoint_model_type(path)
    if model_type != "chameleon":
        raise ValueError(f"vqgan_path: {str(vqgan_path)!r} is set, but {path} is a {model_type!r} checkpoint, which decodes its "
                         f"images itself (only Chameleon / Lumina-mGPT checkpoints take a separate VQ-GAN)")
    if not (Path(vqgan_path).expanduser() / CONFIG_NAME).is_file():
        raise ValueError(f"vqgan_path: {str(vqgan_path)!r} holds no {CONFIG_NAME} (the VQ-GAN's folder: {CONFIG_NAME} and vqgan.ckpt, "
                         f"as Lumina-mGPT keeps them in ckpts/chameleon/tokenizer/)")


def resolve_t2i_path(model: str | Path) -> Path:
    """``"reference"`` -> the shipped weights folder; anything else -> that path."""
    if isinstance(model, str) and model == REFERENCE_NAME:
        return REFERENCE_T2I_DIR
    return Path(model).expanduser()


#: weight files a fingerprint reads (sharded or not)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
_FINGERPRINT_CHUNKS, _FINGERPRINT_CHUNK_BYTES = 16, 1 << 16


def weights_fingerprint(path: str | Path) -> str:
    """A short id of the weight files in ``path`` that changes when the weights do.

    Hashes each file's name, size and 16 evenly spaced 64 KiB chunks (the whole file when it
    is smaller than that), so a 15 GB checkpoint costs ~1 MB of reads per file. Retrained or
    replaced weights change it; a one-byte edit between chunks may not.
    """
    import hashlib

    digest = hashlib.sha256()
    files = sorted({f for pattern in WEIGHT_PATTERNS for f in Path(path).glob(pattern) if f.is_file()})
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        span = _FINGERPRINT_CHUNKS * _FINGERPRINT_CHUNK_BYTES
        offsets = [0] if size <= span else [i * (size - _FINGERPRINT_CHUNK_BYTES) // (_FINGERPRINT_CHUNKS - 1) for i in range(_FINGERPRINT_CHUNKS)]
        with open(file, "rb") as stream:
            for offset in offsets:
                stream.seek(offset)
                digest.update(stream.read(span if size <= span else _FINGERPRINT_CHUNK_BYTES))
    return digest.hexdigest()[:16]


def checkpoint_model_type(path: Path) -> str:
    """``model_type`` from ``path/config.json`` (FileNotFoundError / ValueError naming the path)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no text-to-image checkpoint at {path}: {config_file.name} not found")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"checkpoint {path}: cannot read {config_file.name}: {error}") from error
    if not model_type:
        raise ValueError(f"checkpoint {path}: config.json has no model_type")
    return str(model_type)


def load_t2i_target(model: str | Path, dtype: torch.dtype = torch.float32, vqgan_path: str | Path | None = None, **kwargs: Any) -> Any:
    """Load the text-to-image adapter for ``model`` ("reference" or a local folder).

    vqgan_path: a Chameleon / Lumina-mGPT checkpoint's VQ-GAN folder (None: ``vqgan/`` in the
    checkpoint folder; ``check_vqgan_path``). kwargs go to the adapter (e.g. ``use_chat_template``
    for Janus, ``image_area`` for Emu3).
    Raises FileNotFoundError when the folder has no config.json and ValueError naming the path
    and model_type when no adapter handles it.
    """
    path = resolve_t2i_path(model)
    try:
        model_type = checkpoint_model_type(path)
    except FileNotFoundError as error:
        if path == REFERENCE_T2I_DIR:
            raise FileNotFoundError(f"the reference text-to-image model is not available yet: {error}") from error
        raise
    loader = T2I_LOADERS.get(model_type)
    if loader is None:
        raise CheckpointError(
            f"checkpoint {path}: model_type={model_type!r} is not a supported text-to-image model "
            f"(supported: {sorted(T2I_LOADERS)})"
        )
    check_vqgan_path(path, vqgan_path)
    if vqgan_path is not None:
        kwargs["vqgan_path"] = Path(vqgan_path).expanduser()
    logger.info("loading %s text-to-image target from %s", model_type, path)
    return loader(path, dtype, **kwargs)


# -- vision-language models and their drafts -------------------------------------------------

REFERENCE_VLM_DIR = Path(__file__).resolve().parent.parent / "reference" / "weights" / "vlm"
#: drafts shipped for the reference VLM: method -> folder
REFERENCE_DRAFT_DIRS = {
    "vispec": REFERENCE_VLM_DIR.parent / "vlm-drafts" / "vispec",
    "eagle": REFERENCE_VLM_DIR.parent / "vlm-drafts" / "eagle",
    "assistant": REFERENCE_VLM_DIR.parent / "vlm-drafts" / "assistant",
}


def resolve_vlm_path(model: str | Path) -> Path:
    """``"reference"`` -> the shipped LLaVA folder; anything else -> that path."""
    if isinstance(model, str) and model == REFERENCE_NAME:
        return REFERENCE_VLM_DIR
    return Path(model).expanduser()


def load_vlm_target(model: str | Path, dtype: torch.dtype = torch.float32, device: str | None = None) -> Any:
    """Load a ``VisionLanguageTarget`` ("reference" or a local LLaVA / LLaVA-NeXT / Qwen2(.5)-VL folder)."""
    from raydec.models.hf_vlm import VisionLanguageTarget  # lazy: VLM model code (transformers, ~2 s) loads only for captioning

    path = resolve_vlm_path(model)
    logger.info("loading vision-language target from %s", path)
    return VisionLanguageTarget.from_pretrained(path, dtype=dtype, device=device or "cpu")


def resolve_draft_path(model: str | Path, method: str, draft_model: str | Path | None) -> Path:
    """The draft folder for ``method`` (vispec | eagle): ``draft_model`` when given, else the one
    shipped with the reference VLM (other targets must name their draft)."""
    if draft_model is not None:
        return Path(draft_model).expanduser()
    if resolve_vlm_path(model) == REFERENCE_VLM_DIR and method in REFERENCE_DRAFT_DIRS:
        return REFERENCE_DRAFT_DIRS[method]
    raise ValueError(
        f"decode.method={method!r} needs a trained draft: set decode.draft_model to its folder "
        f"(train one with jobs/train_vispec.py)"
    )
