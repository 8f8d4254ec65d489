"""Load a shipped reference model by name: ``load("t2i")`` -> ``(model, processor)``.

Each entry of :data:`REFERENCE_MODELS` names a weights folder (``from_pretrained`` layout,
relative to ``raydec/reference/weights/``) and the Hugging Face model / processor classes
that read it. Loading is local only: no hub access, ever. To add a model, add an entry.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


@dataclass(frozen=True)
class ReferenceModel:
    """Where a reference model lives and which ``transformers`` classes load it."""

    folder: str
    model_class: str
    processor_class: str

    @property
    def path(self) -> Path:
        """Absolute path of the weights folder."""
        return WEIGHTS_DIR / self.folder


REFERENCE_MODELS: dict[str, ReferenceModel] = {
    "t2i": ReferenceModel("t2i", "JanusForConditionalGeneration", "JanusProcessor"),
    "vlm": ReferenceModel("vlm", "LlavaForConditionalGeneration", "LlavaProcessor"),
}


def _transformers_class(name: str) -> Any:
    """A class exported by ``transformers`` (imported on first use)."""
    return getattr(importlib.import_module("transformers"), name)


def load(name: str, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Load reference model ``name`` and its processor from the shipped weights, in eval mode.

    Raises ``KeyError`` naming the known models for an unknown ``name`` and
    ``FileNotFoundError`` when the weights folder is missing.
    """
    if name not in REFERENCE_MODELS:
        raise KeyError(f"unknown reference model {name!r}; known: {sorted(REFERENCE_MODELS)}")
    entry = REFERENCE_MODELS[name]
    if not (entry.path / "config.json").exists():
        raise FileNotFoundError(f"reference model {name!r}: no weights at {entry.path}")
    model = _transformers_class(entry.model_class).from_pretrained(entry.path, dtype=dtype, local_files_only=True)
    model.eval()
    processor = _transformers_class(entry.processor_class).from_pretrained(entry.path, local_files_only=True)
    logger.info("loaded reference model %r from %s", name, entry.path)
    return model, processor
