"""Rasterisation of the shapes world: geometry, shades, textured random blocks and painting.

Block and box geometry (``block_size``, ``object_box``, exact integer ``shape_mask``), the
shades of a palette colour and of a noisy background, the "iid" / "runs" textures of random
blocks (``random_levels``), and the painting of a scene into a ``[H, W, 3]`` uint8 image
(``render``) together with its mask of randomly drawn pixels (``random_block_mask``). All
randomness comes from ``default_rng([seed, 1])`` and all rasterisation is integer arithmetic.
The public names are re-exported by :mod:`raydec.reference.shapes`.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from raydec.reference.shapes.scene import (
    BACKGROUND_COLORS,
    BACKGROUND_SPREAD,
    BACKGROUNDS,
    COLORS,
    FILLS,
    GRID_BLOCKS,
    NOISE_HORIZON_ROWS,
    POSITIONS,
    RUNS_STAY,
    SHAPES,
    TEXTURES,
    RENDER_STREAM,
    ShapeObject,
    ShapesSample,
)

logger = logging.getLogger(__name__)

_SPECKLE_MAX_BASE_SHARE = (3, 5)  # a speckled object shows its full colour on at most 3/5 of it


# ----------------------------------------------------------------------------- geometry


def block_size(image_size: int) -> int:
    """Pixels per block side; ``image_size`` must be a positive multiple of 16."""
    if image_size <= 0 or image_size % GRID_BLOCKS:
        raise ValueError(f"image_size must be a positive multiple of {GRID_BLOCKS}, got {image_size}")
    return image_size // GRID_BLOCKS


def object_box(position: str, size: str, image_size: int = 64) -> tuple[int, int, int]:
    """``(x0, y0, side)`` in pixels of the square box an object of this size fills in its cell."""
    block = block_size(image_size)
    row, col = divmod(POSITIONS.index(position), 3)
    span_blocks, offset_blocks = (4, 1) if size == "large" else (2, 2)
    return (5 * col + offset_blocks) * block, (5 * row + offset_blocks) * block, span_blocks * block


def shape_mask(shape: str, side: int) -> np.ndarray:
    """Boolean ``[side, side]`` mask of ``shape`` in its box (exact integer geometry).

    Pixel centres get doubled coordinates ``u, v`` (odd integers in ``(-side, side)``).
    """
    coords = 2 * np.arange(side, dtype=np.int64) + 1 - side
    v, u = coords[:, None], coords[None, :]
    if shape == "circle":
        mask = u * u + v * v <= side * side
    elif shape == "square":
        mask = np.ones((side, side), dtype=bool)
    elif shape == "diamond":
        mask = np.abs(u) + np.abs(v) <= side
    elif shape == "triangle":  # apex up, base on the bottom edge
        mask = 2 * np.abs(u) <= v + side + 1
    elif shape == "cross":  # arms a third of the box wide
        mask = (3 * np.abs(u) <= side) | (3 * np.abs(v) <= side)
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    return np.broadcast_to(mask, (side, side)).copy()


# ----------------------------------------------------------------------------- colours


def tint(color: str) -> tuple[int, int, int]:
    """The light stripe shade of a palette colour: halfway to white."""
    return tuple((c + 255) // 2 for c in COLORS[color])  # type: ignore[return-value]


def speckle_shades(color: str) -> tuple[tuple[int, int, int], ...]:
    """The shades a speckled block can take: full, 3/4 and 1/2 brightness."""
    base = COLORS[color]
    return (base, tuple(c * 3 // 4 for c in base), tuple(c // 2 for c in base))  # type: ignore[return-value]


def background_levels(background_color: str) -> tuple[int, int, int]:
    """The three grey levels (middle, darker, lighter) of a noisy background."""
    level = BACKGROUND_COLORS[background_color]
    return level, level - BACKGROUND_SPREAD, level + BACKGROUND_SPREAD


# ----------------------------------------------------------------------------- rendering


def _blocks_to_pixels(block_values: np.ndarray, block: int) -> np.ndarray:
    """Repeat a ``[16, 16, ...]`` block array to pixels ``[16*block, 16*block, ...]``."""
    return np.repeat(np.repeat(block_values, block, axis=0), block, axis=1)


def check_texture(texture: str) -> str:
    """``texture`` if it names a known texture, else a ValueError naming it."""
    if texture not in TEXTURES:
        raise ValueError(f"texture must be one of {TEXTURES}, got {texture!r}")
    return texture


def random_levels(rng: np.random.Generator, texture: str, levels: int = 3) -> np.ndarray:
    """``[16, 16]`` int64 grid of random values in ``[0, levels)`` with the given texture.

    "iid": independent uniform draws. "runs": in each row a block keeps its left neighbour's
    value with probability ``RUNS_STAY`` (a fresh uniform draw otherwise; the first block of a
    row is always fresh), so values come in horizontal runs of mean length ~1 / (1 - P(repeat)).
    """
    fresh = rng.integers(0, levels, size=(GRID_BLOCKS, GRID_BLOCKS))
    if check_texture(texture) == "iid":
        return fresh
    keep = rng.random(size=(GRID_BLOCKS, GRID_BLOCKS)) < RUNS_STAY
    grid = fresh.copy()
    for col in range(1, GRID_BLOCKS):
        grid[:, col] = np.where(keep[:, col], grid[:, col - 1], fresh[:, col])
    return grid


def _render_background(
    kind: str, color: str, rng: np.random.Generator, size: int, texture: str = "iid"
) -> tuple[np.ndarray, np.ndarray]:
    """Background grey levels ``[size, size]`` int64 and its random-pixel mask ``[size, size]`` bool."""
    level = BACKGROUND_COLORS[color]
    random_mask = np.zeros((size, size), dtype=bool)
    if kind == "plain":
        return np.full((size, size), level, dtype=np.int64), random_mask
    if kind == "gradient":
        drop = (2 * BACKGROUND_SPREAD * np.arange(size, dtype=np.int64)) // (size - 1)
        rows = level + BACKGROUND_SPREAD - drop
        return np.repeat(rows[:, None], size, axis=1), random_mask
    if kind == "noisy":  # flat "sky" above a random horizon, block noise ("ground") below it
        block = size // GRID_BLOCKS
        levels = np.array(background_levels(color), dtype=np.int64)
        choice = random_levels(rng, texture)
        horizon = NOISE_HORIZON_ROWS[0] + int(rng.integers(0, len(NOISE_HORIZON_ROWS)))
        choice[:horizon] = 0
        random_mask[horizon * block :] = True
        return _blocks_to_pixels(levels[choice], block), random_mask
    raise ValueError(f"unknown background {kind!r}; expected one of {BACKGROUNDS}")


def _speckle_choice(mask: np.ndarray, rng: np.random.Generator, block: int, texture: str = "iid") -> np.ndarray:
    """Per-pixel shade index (0..2) of a speckled object; redrawn until visibly speckled.

    Accepted when the full shade covers at most 3/5 of the object and two shades appear.
    """
    total = int(mask.sum())
    num, den = _SPECKLE_MAX_BASE_SHARE
    for _ in range(64):
        choice = _blocks_to_pixels(random_levels(rng, texture), block)
        counts = np.bincount(choice[mask], minlength=3)
        if den * int(counts[0]) <= num * total and int((counts > 0).sum()) >= 2:
            return choice
    logger.debug("speckle redraw budget spent; keeping the last draw")
    return choice


def _render_object(
    image: np.ndarray, random_mask: np.ndarray, obj: ShapeObject, rng: np.random.Generator, texture: str = "iid"
) -> None:
    """Paint one object into ``image`` ``[H, W, 3]`` and mark speckled pixels in ``random_mask``."""
    size = image.shape[0]
    block = block_size(size)
    x0, y0, side = object_box(obj.position, obj.size, size)
    mask = np.zeros((size, size), dtype=bool)
    mask[y0 : y0 + side, x0 : x0 + side] = shape_mask(obj.shape, side)
    random_mask[mask] = obj.fill == "speckled"
    if obj.fill == "solid":
        image[mask] = COLORS[obj.color]
    elif obj.fill == "striped":
        band = np.arange(size)[:, None] // max(1, block // 2) % 2 == 1  # [H, 1]
        colors = np.where(band[..., None], np.array(tint(obj.color)), np.array(COLORS[obj.color]))
        image[mask] = np.broadcast_to(colors, (size, size, 3))[mask]
    elif obj.fill == "speckled":
        shades = np.array(speckle_shades(obj.color), dtype=np.int64)
        image[mask] = shades[_speckle_choice(mask, rng, block, texture)][mask]
    else:
        raise ValueError(f"unknown fill {obj.fill!r}; expected one of {FILLS}")


def _render_with_random_mask(
    objects: Sequence[ShapeObject],
    background: str,
    background_color: str,
    seed: int,
    image_size: int,
    texture: str = "iid",
) -> tuple[np.ndarray, np.ndarray]:
    """``(image [H, W, 3] uint8, random-pixel mask [H, W] bool)``."""
    block_size(image_size)
    check_texture(texture)
    rng = np.random.default_rng([seed, RENDER_STREAM])
    grey, random_mask = _render_background(background, background_color, rng, image_size, texture)
    image = np.repeat(grey[..., None], 3, axis=2)
    for obj in objects:
        _render_object(image, random_mask, obj, rng, texture)
    return np.clip(image, 0, 255).astype(np.uint8), random_mask


def render(
    objects: Sequence[ShapeObject],
    background: str,
    background_color: str,
    seed: int,
    image_size: int = 64,
    texture: str = "iid",
) -> np.ndarray:
    """Render a scene to ``[image_size, image_size, 3]`` uint8; ``seed`` drives noise and speckles."""
    return _render_with_random_mask(objects, background, background_color, seed, image_size, texture)[0]


def random_block_mask(sample: ShapesSample) -> np.ndarray:
    """``[16, 16]`` bool: blocks whose pixels are mostly randomly drawn (speckles, noisy background)."""
    size = sample.image.shape[0]
    _, random_mask = _render_with_random_mask(
        sample.objects, sample.background, sample.background_color, sample.seed, size, sample.texture
    )
    block = block_size(size)
    counts = random_mask.reshape(GRID_BLOCKS, block, GRID_BLOCKS, block).sum(axis=(1, 3))
    return 2 * counts > block * block
