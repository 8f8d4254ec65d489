"""raydec: lossless speculative decoding on Ray, for text-to-image (SJD-PAC) and vision-language
models (ViSpec).

    import raydec
    images = raydec.generate_images(["a red circle on the left"], model="reference")
    captions = raydec.caption_images([images[0].image], model="reference",
                                     decode=raydec.DecodeConfig(method="vispec"))

The public names are below; everything else is internal. They load on first use, so
``import raydec`` (a Ray driver, the CLI) costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_PUBLIC = {
    "generate_images": "raydec.api",
    "caption_images": "raydec.api",
    "check_identity": "raydec.api",
    "CheckReport": "raydec.api",
    "load_target": "raydec.api",
    "load_draft_model": "raydec.api",
    "ImageResult": "raydec.api",
    "CaptionResult": "raydec.api",
    "DEFAULT_CAPTION_PROMPT": "raydec.api",
    "DecodeConfig": "raydec.config",
    "SamplingConfig": "raydec.config",
    "JacobiDraftConfig": "raydec.config",
    "DraftTreeConfig": "raydec.config",
    "DecodeSession": "raydec.speculative.engine",
    "Engine": "raydec.speculative.engine",
    "RowRequest": "raydec.speculative.requests",
    "RowOutput": "raydec.speculative.requests",
}

__all__ = [
    "DEFAULT_CAPTION_PROMPT", "CaptionResult", "CheckReport", "DecodeConfig", "DecodeSession", "DraftTreeConfig", "Engine", "ImageResult",
    "JacobiDraftConfig", "RowOutput", "RowRequest", "SamplingConfig", "caption_images", "check_identity", "generate_images", "load_draft_model",
    "load_target",
]
assert sorted(__all__) == sorted(_PUBLIC)

#: public names of earlier releases -> the module whose ``__getattr__`` warns and hands out the new one
_RENAMED = {"load_draft": "raydec.api"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:  # not cached here: every use warns
        return getattr(importlib.import_module(_RENAMED[name]), name)
    if name not in _PUBLIC:
        raise AttributeError(f"module 'raydec' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from raydec.api import (DEFAULT_CAPTION_PROMPT, CaptionResult, CheckReport, ImageResult, caption_images, check_identity,
                            generate_images, load_draft_model, load_target)
    from raydec.config import DecodeConfig, DraftTreeConfig, JacobiDraftConfig, SamplingConfig
    from raydec.speculative.engine import DecodeSession, Engine
    from raydec.speculative.requests import RowOutput, RowRequest
