"""The public Python API: generate images, caption images, load models once.

    from raydec.api import generate_images, caption_images
    results = generate_images(["a red circle on the left"], model="reference")
    results[0].image.save("out.png")
    captions = caption_images([results[0].image], model="reference",
                              decode=DecodeConfig(method="vispec"))

``load_target`` loads a model once (cached per model, kind, dtype and device), so repeated
calls do not reload weights; both functions accept ``model`` as "reference", a local
checkpoint folder, or an already loaded target. ``load_draft_model`` loads the draft model
(vispec / eagle) of a target the same way. ``check_identity`` decodes rows with plain AR and with
a method and checks that the method's tokens are AR's (``raydec check``).
"""

import warnings
from typing import Any

from raydec.api.batching import continuous_batching
from raydec.api.captions import DEFAULT_CAPTION_PROMPT, CaptionResult, caption_images
from raydec.api.check import CheckReport, check_identity
from raydec.api.images import ImageResult, generate_images
from raydec.api.inputs import SEED_LIMIT, over_checkpoint, sized
from raydec.models.loading import draft_dtype, load_draft_model, load_target
from raydec.validation import RENAMES_REMOVED_IN

__all__ = [
    "DEFAULT_CAPTION_PROMPT", "SEED_LIMIT", "CaptionResult", "CheckReport", "ImageResult", "caption_images", "check_identity",
    "continuous_batching",
    "draft_dtype", "generate_images", "load_draft_model", "load_target", "over_checkpoint", "sized",
]

#: Python names of earlier releases (old -> new): still importable until RENAMES_REMOVED_IN, with a
#: FutureWarning naming the new name (docs/configuration.md lists them with the renamed keys and flags)
RENAMED_NAMES = {"raydec.api.load_draft": "raydec.api.load_draft_model"}


def __getattr__(name: str) -> Any:
    old = f"{__name__}.{name}"
    if old not in RENAMED_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    new = RENAMED_NAMES[old]
    warnings.warn(f"{old} is now {new.rsplit('.', 1)[1]}; {name} stops loading in raydec {RENAMES_REMOVED_IN}",
                  FutureWarning, stacklevel=2)
    return globals()[new.rsplit(".", 1)[1]]
