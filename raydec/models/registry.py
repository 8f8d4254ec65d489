"""Pick the text-to-image adapter for a checkpoint folder by its ``config.model_type``.

``load_t2i_target("reference")`` loads the shipped reference model
(``raydec/reference/weights/t2i``); any other name is a local ``from_pretrained`` folder, a hub id
or an ``s3://`` prefix (``sources``), resolved to a folder on this node (Janus / Janus-Pro -> ``JanusT2ITarget``, Emu3 -> ``Emu3T2ITarget``, Lumina-mGPT and
other Chameleon checkpoints -> ``ChameleonT2ITarget``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from raydec.models.base import CheckpointError
from raydec.models.sources import FileSet, model_folder
from raydec.models.vqgan import CONFIG_NAME, VQGanConfig

if TYPE_CHECKING:
    from raydec.io.config import S3Config


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


def t2i_size_problem(
    model: str | Path, width: int, height: int, vqgan_path: str | Path | None = None, *, s3: Optional["S3Config"] = None,
) -> str | None:
    """Why the text-to-image checkpoint ``model`` cannot make ``width`` x ``height`` images, from
    its config alone (no weights load or download), or None. The positions a size needs are checked
    where it decodes."""
    from transformers import AutoConfig

    path = resolve_t2i_path(model, s3=s3, files="config")
    model_type = checkpoint_model_type(path)
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    if model_type == "chameleon":
        vqgan = model_folder(vqgan_path, s3=s3, files="config", field="vqgan_path") if vqgan_path else None
        return _chameleon_size_problem(path, config, width, height, vqgan)
    return T2I_SIZE_PROBLEMS[model_type](path, config, width, height) if model_type in T2I_SIZE_PROBLEMS else None


def check_vqgan_path(model: str | Path, vqgan_path: str | Path | None, *, s3: Optional["S3Config"] = None) -> None:
    """A ``vqgan_path`` only for a checkpoint that decodes with a separate VQ-GAN (Chameleon /
    Lumina-mGPT), naming a folder (or hub id, or ``s3://`` prefix) that holds one (a ValueError naming
    the field otherwise). Reads configs only."""
    if vqgan_path is None:
        return

    path = resolve_t2i_path(model, s3=s3, files="config")
    model_type = checkpoint_model_type(path)
    if model_type != "chameleon":
        raise ValueError(f"vqgan_path: {str(vqgan_path)!r} is set, but {path} is a {model_type!r} checkpoint, which decodes its "
                         f"images itself (only Chameleon / Lumina-mGPT checkpoints take a separate VQ-GAN)")
    if not (model_folder(vqgan_path, s3=s3, files="config", field="vqgan_path") / CONFIG_NAME).is_file():
        raise ValueError(f"vqgan_path: {str(vqgan_path)!r} holds no {CONFIG_NAME} (the VQ-GAN's folder: {CONFIG_NAME} and vqgan.ckpt, "
                         f"as Lumina-mGPT keeps them in ckpts/chameleon/tokenizer/)")


def resolve_t2i_path(model: str | Path, *, s3: Optional["S3Config"] = None, files: FileSet = "all") -> Path:
    """``"reference"`` -> the shipped weights folder; a local folder -> that path; a hub id or ``s3://``
    model -> its copy on this node (``sources.model_folder``: ``files`` "config" fetches no weights)."""
    if isinstance(model, str) and model == REFERENCE_NAME:
        return REFERENCE_T2I_DIR
    return model_folder(model, s3=s3, files=files)


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


def load_t2i_target(
    model: str | Path, dtype: torch.dtype = torch.float32, vqgan_path: str | Path | None = None, *, s3: Optional["S3Config"] = None,
    **kwargs: Any,
) -> Any:
    """Load the text-to-image adapter for ``model`` ("reference", a local folder, a hub id or ``s3://``;
    a remote one is fetched into this node's cache first, with ``s3`` for buckets).

    vqgan_path: a Chameleon / Lumina-mGPT checkpoint's VQ-GAN folder, hub id or ``s3://`` prefix (None:
    ``vqgan/`` in the checkpoint folder; ``check_vqgan_path``). kwargs go to the adapter (e.g.
    ``use_chat_template`` for Janus, ``image_area`` for Emu3).
    Raises FileNotFoundError when the folder has no config.json and ValueError naming the path
    and model_type when no adapter handles it.
    """
    path = resolve_t2i_path(model, s3=s3)
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
    if vqgan_path is not None:
        vqgan_path = model_folder(vqgan_path, s3=s3, field="vqgan_path")
    check_vqgan_path(path, vqgan_path)
    if vqgan_path is not None:
        kwargs["vqgan_path"] = vqgan_path
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


def resolve_vlm_path(model: str | Path, *, s3: Optional["S3Config"] = None, files: FileSet = "all") -> Path:
    """``"reference"`` -> the shipped LLaVA folder; anything else as ``resolve_t2i_path``."""
    if isinstance(model, str) and model == REFERENCE_NAME:
        return REFERENCE_VLM_DIR
    return model_folder(model, s3=s3, files=files)


def is_reference_vlm(model: str | Path) -> bool:
    """Whether ``model`` names the shipped reference VLM ("reference" or its folder), without fetching anything."""
    if isinstance(model, str) and model == REFERENCE_NAME:
        return True
    return isinstance(model, (str, Path)) and not str(model).startswith("s3://") and Path(model).expanduser() == REFERENCE_VLM_DIR


def load_vlm_target(model: str | Path, dtype: torch.dtype = torch.float32, device: str | None = None, *, s3: Optional["S3Config"] = None) -> Any:
    """Load a ``VisionLanguageTarget`` ("reference" or a LLaVA / LLaVA-NeXT / Qwen2(.5)-VL folder, hub id or ``s3://`` model)."""
    from raydec.models.hf_vlm import VisionLanguageTarget  # lazy: VLM model code (transformers, ~2 s) loads only for captioning

    path = resolve_vlm_path(model, s3=s3)
    logger.info("loading vision-language target from %s", path)
    return VisionLanguageTarget.from_pretrained(path, dtype=dtype, device=device or "cpu")


def resolve_draft_path(
    model: str | Path, method: str, draft_model: str | Path | None, *, s3: Optional["S3Config"] = None, files: FileSet = "all",
) -> Path:
    """The draft folder for ``method`` (vispec | eagle): ``draft_model`` when given (a folder, hub id or
    ``s3://``, resolved as ``resolve_t2i_path``), else the one shipped with the reference VLM (other
    targets must name their draft)."""
    if draft_model is not None:
        return model_folder(draft_model, s3=s3, files=files, field="decode.draft_model")
    if is_reference_vlm(model) and method in REFERENCE_DRAFT_DIRS:
        return REFERENCE_DRAFT_DIRS[method]
    raise ValueError(
        f"decode.method={method!r} needs a trained draft: set decode.draft_model to its folder "
        f"(train one with jobs/train_vispec.py)"
    )
