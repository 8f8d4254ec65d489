"""The "shapes" world: a seeded generator of (image, prompt, description) triples.

Every sample is a pure function of its integer seed (``make_sample(seed)``): the same seed
gives the same bytes on any machine. All randomness comes from ``numpy.random.default_rng``
(PCG64) and all rasterisation is exact integer arithmetic.

The world
---------
* A ``image_size`` x ``image_size`` RGB image (default 64; a multiple of 16), seen as a
  16 x 16 grid of *blocks* (4 x 4 pixels at size 64; one block is one image token of a
  VQ tokenizer with downsample 4).
* 1-3 objects, each on a distinct cell of a 3 x 3 grid. Block columns / rows 0, 5, 10 and
  15 are always background; a "large" object fills a 4 x 4-block box (blocks 1-4, 6-9 or
  11-14), a "small" one the central 2 x 2 blocks of that box. Objects never overlap.
* Shapes are exact integer inside-tests on doubled pixel-centre coordinates.
* Fills: "solid" (the palette colour), "striped" (horizontal bands, half a block high, of
  the colour and its light tint), "speckled" (every block takes a random shade of the
  colour: full, 3/4 or 1/2 brightness).
* Backgrounds are achromatic (white / grey / black): "plain" (flat), "gradient" (smooth,
  vertical, light at the top) or "noisy" (flat above a random horizon block row, 3-8, and
  below it every block takes a random one of three levels: sky and textured ground).
  Randomness therefore lives at the scale of one block, never per pixel.
* Texture (``texture=``): how the random blocks of speckles and noisy ground are drawn.
  ``"iid"`` (the default): each block independently. ``"runs"``: in raster order each block
  keeps its left neighbour's value with probability ``RUNS_STAY`` and otherwise draws afresh
  (so it repeats the left block with probability ``RUNS_STAY + (1 - RUNS_STAY) / 3``), as a
  photograph's texture depends on its neighbours. The draw of the scene and the text do not
  depend on the texture: only the random blocks differ.

Text and tokenisation
---------------------
All text is lower case. A text is tokenised by splitting on whitespace after putting spaces
around ``,`` ``.`` and ``?``, so those three are tokens of their own (``words(text)``).
``vocabulary()`` lists every token that prompts, descriptions, questions and answers can use.

Modules
-------
This module is the world's public face: ``make_sample``, ``sample_images`` and ``to_pil`` live
here, and it re-exports (``__all__``) the public names of its parts:
:mod:`raydec.reference.shapes.scene` (constants, records, the seeded scene draw),
:mod:`raydec.reference.shapes.render` (geometry, shades, textures, rendering) and
:mod:`raydec.reference.shapes.text` (tokenisation, prompts, descriptions, questions).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from PIL import Image

from raydec.reference.shapes.render import (
    background_levels,
    block_size,
    check_texture,
    object_box,
    random_block_mask,
    random_levels,
    render,
    shape_mask,
    speckle_shades,
    tint,
)
from raydec.reference.shapes.scene import (
    BACKGROUND_COLORS,
    BACKGROUND_SPREAD,
    BACKGROUNDS,
    COLORS,
    FILLS,
    GRID_BLOCKS,
    HELD_OUT_SEED_START,
    MAX_OBJECTS,
    NOISE_HORIZON_ROWS,
    NUMBER_WORDS,
    POSITIONS,
    RUNS_STAY,
    SHAPES,
    SIZES,
    TEXTURES,
    TEXT_STREAM,
    RandomSource,
    ShapeObject,
    ShapesSample,
    random_scene,
)
from raydec.reference.shapes.text import describe, prompt_for, question_answers, vocabulary, words

# The world's public names: defined in shapes.scene (constants, records, the scene draw),
# shapes.render (geometry, shades, rendering) and shapes.text (text), used from here.
__all__ = [
    "BACKGROUNDS", "BACKGROUND_COLORS", "BACKGROUND_SPREAD", "COLORS", "FILLS", "GRID_BLOCKS",
    "HELD_OUT_SEED_START", "MAX_OBJECTS", "NOISE_HORIZON_ROWS", "NUMBER_WORDS", "POSITIONS", "RUNS_STAY",
    "SHAPES", "SIZES", "TEXTURES", "RandomSource", "ShapeObject", "ShapesSample",
    "background_levels", "block_size", "check_texture", "describe", "make_sample", "object_box", "prompt_for",
    "question_answers", "random_block_mask", "random_levels", "random_scene", "render", "sample_images",
    "shape_mask", "speckle_shades", "tint", "to_pil", "vocabulary", "words",
]  # fmt: skip


def to_pil(image: np.ndarray) -> Image.Image:
    """A ``[H, W, 3]`` uint8 array as an RGB PIL image."""
    array = np.ascontiguousarray(image, dtype=np.uint8)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"image must be [H, W, 3], got shape {array.shape}")
    return Image.fromarray(array)


# ----------------------------------------------------------------------------- sampling


def sample_images(seeds: Sequence[int]) -> list[Image.Image]:
    """The shapes-world images of ``seeds``: the image source the reference drafts train and
    are evaluated on (``raydec.train``'s ``image_source``)."""
    return [to_pil(make_sample(int(seed)).image) for seed in seeds]


def make_sample(seed: int, image_size: int = 64, texture: str = "iid") -> ShapesSample:
    """The sample of ``seed`` (a non-negative integer): same seed, same bytes, everywhere.

    ``texture`` changes only how speckles and noisy ground are drawn (see the module doc).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    objects, background, background_color = random_scene(np.random.default_rng(seed))
    return ShapesSample(
        seed=seed,
        image=render(objects, background, background_color, seed, image_size, texture),
        objects=objects,
        background=background,
        background_color=background_color,
        prompt=prompt_for(objects, background, background_color),
        description=describe(
            objects, background, background_color, np.random.default_rng([seed, TEXT_STREAM])
        ),
        texture=texture,
    )
