"""The public Python API: generate images, caption images, load models once.

    from raydec.api import generate_images, caption_images
    results = generate_images(["a red circle on the left"], model="reference")
    results[0].image.save("out.png")
    captions = caption_images([results[0].image], model="reference",
                              decode=DecodeConfig(method="vispec"))

``load_target`` loads a model once (cached per model, kind, dtype and device), so repeated
calls do not reload weights; both functions accept ``model`` as "reference", a local
checkpoint folder, or an already loaded target.
"""

from raydec.api.batching import continuous_batching
from raydec.api.captions import DEFAULT_CAPTION_PROMPT, CaptionResult, caption_images
from raydec.api.images import ImageResult, generate_images
from raydec.api.inputs import SEED_LIMIT, over_checkpoint, sized
from raydec.models.loading import draft_dtype, load_draft, load_target

__all__ = [
    "DEFAULT_CAPTION_PROMPT", "SEED_LIMIT", "CaptionResult", "ImageResult", "caption_images", "continuous_batching",
    "draft_dtype", "generate_images", "load_draft", "load_target", "over_checkpoint", "sized",
]
