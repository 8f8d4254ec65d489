"""Refine a trained reference VLM to finer image patches (more image tokens per image).

ViSpec's premise is that a one-layer draft loses the image among hundreds of image tokens.
The first reference VLM cuts a 64x64 image into 8x8-pixel patches (64 image tokens); refining
by ``factor=2`` gives 4x4-pixel patches (256 tokens: one per block of the shapes world).

The refined model starts from the trained one, not from scratch:

- patch embedding: the new ``p/f`` kernel is the old ``p`` kernel summed over ``f x f`` cells,
  so on an image it computes exactly what the old kernel computed on the image upscaled ``f``
  times by pixel repetition (``nearest``);
- position embeddings: the ``g x g`` grid is bicubically interpolated to ``gf x gf``; the CLS
  row is kept;
- every other weight (vision layers, projector, language model) is copied unchanged.

The model is not yet good at the finer grid: continue training it
(``python -m raydec.reference.train vlm --vlm-init-from DIR --vlm-refine-patches 2 ...``).
"""

from __future__ import annotations

import copy

import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor


def refine_patch_kernel(weight: torch.Tensor, factor: int) -> torch.Tensor:
    """``[C_out, C_in, p, p]`` -> ``[C_out, C_in, p/f, p/f]``: each new tap sums an ``f x f`` cell."""
    c_out, c_in, p, q = weight.shape
    if p != q or p % factor:
        raise ValueError(f"patch kernel {p}x{q} cannot be refined by factor={factor}")
    return weight.reshape(c_out, c_in, p // factor, factor, q // factor, factor).sum(dim=(3, 5))


def refine_position_table(table: torch.Tensor, factor: int) -> torch.Tensor:
    """``[1 + g*g, D]`` (CLS first) -> ``[1 + (g f)^2, D]`` by bicubic interpolation of the grid."""
    cls, grid = table[:1], table[1:]
    side = round(grid.shape[0] ** 0.5)
    if side * side != grid.shape[0]:
        raise ValueError(f"position table of {grid.shape[0]} patches is not a square grid")
    image = grid.T.reshape(1, -1, side, side)  # [1, D, g, g]
    finer = torch.nn.functional.interpolate(image, scale_factor=factor, mode="bicubic", align_corners=False)
    return torch.cat([cls, finer.reshape(table.shape[1], -1).T], dim=0)


def refine_patches(
    model: LlavaForConditionalGeneration, processor: LlavaProcessor, factor: int = 2, max_positions: int = 512
) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """A copy of ``model`` (and a matching processor) with patches ``factor`` times finer.

    ``max_positions`` raises the language model's ``max_position_embeddings`` (a RoPE bound, no
    weights) so that the longer image span plus an answer fits.
    """
    if factor < 2:
        raise ValueError(f"factor must be >= 2, got {factor}")
    config = copy.deepcopy(model.config)
    vision = config.vision_config
    if vision.patch_size % factor:
        raise ValueError(f"patch_size={vision.patch_size} is not divisible by factor={factor}")
    vision.patch_size //= factor
    config.image_seq_length = (vision.image_size // vision.patch_size) ** 2
    config.text_config.max_position_embeddings = max(config.text_config.max_position_embeddings, max_positions)

    state = model.state_dict()
    prefix = next(k for k in state if k.endswith("embeddings.patch_embedding.weight")).rsplit("patch_embedding", 1)[0]
    state[prefix + "patch_embedding.weight"] = refine_patch_kernel(state[prefix + "patch_embedding.weight"], factor)
    state[prefix + "position_embedding.weight"] = refine_position_table(
        state[prefix + "position_embedding.weight"], factor
    )
    state.pop(prefix + "position_ids", None)  # a buffer sized by the new config

    refined = LlavaForConditionalGeneration(config)
    missing, unexpected = refined.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(f"refined state does not match: missing {missing}, unexpected {unexpected}")
    refined.generation_config = copy.deepcopy(model.generation_config)
    refined.to(model.dtype)
    refined_processor = copy.deepcopy(processor)  # same tokenizer and image processor
    refined_processor.patch_size = vision.patch_size  # each <image> expands to the new token count
    return refined, refined_processor
