"""The judge's image reader: a shapes-world image back into objects and background, by fixed rules.

``parse_image`` leans on the world's structure and tolerates blur, colour quantisation and a
few wrong tokens: the always-empty margin blocks give the background (grey level, and a line
fit of brightness against the row tells plain, gradient and noisy apart); in each of the nine
cells the chroma foreground is matched against every (shape, size) template at small shifts
(best overlap: shape and size); a chroma-weighted hue vote gives the colour, and which shades
of that colour the inner pixels show gives the fill (see :mod:`raydec.reference.judge`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Union

import numpy as np
from PIL import Image

from raydec.reference.judge.scene import ParsedScene
from raydec.reference.shapes import (
    BACKGROUND_COLORS,
    BACKGROUND_SPREAD,
    COLORS,
    GRID_BLOCKS,
    POSITIONS,
    SHAPES,
    SIZES,
    ShapeObject,
    object_box,
    shape_mask,
    speckle_shades,
    tint,
)

JUDGE_SIZE = 64  # images of other sizes are resized to this
_MARGIN_BLOCKS = (0, 5, 10, 15)
_SHIFTS = tuple(range(-2, 3))  # template shifts tried, pixels
_WINDOW_PAD = 3  # pixels around a cell's large box searched for its object
_MIN_CHROMA = 40.0  # foreground seed threshold (0..255)
# Chroma, as a share of an object's typical chroma, that counts as fully "object": low enough
# that the darkest speckle shade (1/2 brightness) still counts.
_OBJECTNESS_SCALE = 0.6
_MIN_IOU = 0.4  # weaker template matches are not objects
_NOISE_RESIDUAL = 12.0  # grey levels off the background fit that make a block "noisy"
_NOISY_SHARE = 0.25  # share of lower margin blocks that must be off the fit for "noisy"
_GRADIENT_DROP = float(BACKGROUND_SPREAD)  # half the top-to-bottom drop a gradient is drawn with
_STRIPE_SHARE = 0.25
_SPECKLE_SHARE = 0.2

ImageLike = Union[np.ndarray, Image.Image]


# ----------------------------------------------------------------------------- pixels


def _as_array(image: ImageLike) -> np.ndarray:
    """``[64, 64, 3]`` float64 RGB in 0..255 from a PIL image or an array (uint8 or 0..1 floats)."""
    if isinstance(image, Image.Image):
        array = np.asarray(image.convert("RGB"))
    else:
        array = np.asarray(image)
        if array.ndim == 2:
            array = np.repeat(array[..., None], 3, axis=2)
        if array.ndim != 3 or array.shape[2] not in (3, 4):
            raise ValueError(f"image must be [H, W, 3], got shape {array.shape}")
        array = array[..., :3]
        if array.dtype != np.uint8:
            scale = 255.0 if float(np.nanmax(array, initial=0.0)) <= 1.0 else 1.0
            array = np.nan_to_num(array.astype(np.float64)) * scale
            array = np.clip(array, 0, 255).round().astype(np.uint8)
    if array.shape[:2] != (JUDGE_SIZE, JUDGE_SIZE):
        resized = Image.fromarray(np.ascontiguousarray(array)).resize((JUDGE_SIZE, JUDGE_SIZE), Image.BILINEAR)
        array = np.asarray(resized)
    return array.astype(np.float64)


def _luminance(rgb: np.ndarray) -> np.ndarray:
    """``[..., 3]`` -> ``[...]`` Rec. 601 luma."""
    return rgb @ np.array([0.299, 0.587, 0.114])


def _chroma(rgb: np.ndarray) -> np.ndarray:
    """``[..., 3]`` -> ``[...]`` max minus min channel."""
    return rgb.max(axis=-1) - rgb.min(axis=-1)


def _hue(rgb: np.ndarray) -> np.ndarray:
    """``[..., 3]`` -> ``[...]`` HSV hue in degrees (0 for greys)."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return np.degrees(np.arctan2(np.sqrt(3.0) * (g - b), 2.0 * r - g - b)) % 360.0


_PALETTE_NAMES = tuple(COLORS)
_PALETTE_HUES = _hue(np.array([COLORS[c] for c in _PALETTE_NAMES], dtype=np.float64))


# ----------------------------------------------------------------------------- background


def _block_centres(values: np.ndarray) -> np.ndarray:
    """``[64, 64, ...]`` -> ``[16, 16, ...]`` means over the central 2 x 2 pixels of each block."""
    block = JUDGE_SIZE // GRID_BLOCKS
    lo, hi = block // 4, block - block // 4
    tiles = values.reshape(GRID_BLOCKS, block, GRID_BLOCKS, block, *values.shape[2:])
    return tiles[:, lo:hi, :, lo:hi].mean(axis=(1, 3))


def _parse_background(rgb: np.ndarray) -> tuple[str, str]:
    """``(kind, colour name)`` from the always-empty margin blocks of ``rgb`` ``[64, 64, 3]``."""
    centres = _block_centres(rgb)  # [16, 16, 3]
    lum, chroma = _luminance(centres), _chroma(centres)
    rows = np.arange(GRID_BLOCKS)[:, None] * np.ones((1, GRID_BLOCKS))
    margin = np.zeros((GRID_BLOCKS, GRID_BLOCKS), dtype=bool)
    margin[list(_MARGIN_BLOCKS), :] = True
    margin[:, list(_MARGIN_BLOCKS)] = True
    usable = margin & (chroma < _MIN_CHROMA)  # ignore stray coloured blocks
    if usable.sum() < 8:
        usable = margin
    y, values = rows[usable], lum[usable]
    slope, intercept = np.polyfit(y, values, 1)
    residual = np.abs(values - (intercept + slope * y))
    lower = y >= GRID_BLOCKS // 2
    noisy_share = float((residual[lower] > _NOISE_RESIDUAL).mean()) if lower.any() else 0.0
    level = float(np.median(values))
    color = min(BACKGROUND_COLORS, key=lambda name: abs(BACKGROUND_COLORS[name] - level))
    if noisy_share >= _NOISY_SHARE:
        return "noisy", color
    if abs(slope) * (GRID_BLOCKS - 1) >= _GRADIENT_DROP:
        return "gradient", color
    return "plain", color


# ----------------------------------------------------------------------------- objects


@dataclass(frozen=True)
class _Template:
    shape: str
    size: str
    mask: np.ndarray  # [win, win] bool, in window coordinates


def _box_blur(masks: np.ndarray) -> np.ndarray:
    """3 x 3 box blur of ``[T, h, w]`` float masks (outside counts as empty)."""
    padded = np.pad(masks, ((0, 0), (1, 1), (1, 1)))
    h, w = masks.shape[1:]
    shifted = (padded[:, dy : dy + h, dx : dx + w] for dy, dx in itertools.product(range(3), range(3)))
    return sum(shifted) / 9.0


@lru_cache(maxsize=None)
def _templates() -> tuple[tuple[_Template, ...], np.ndarray]:
    """All (shape, size, shift) templates of a cell window, and soft versions ``[3T, win * win]``.

    Each template appears sharp, 3 x 3-blurred once and twice, so blurred images match
    without bias toward round or large shapes.
    """
    _, _, large_side = object_box("center", "large", JUDGE_SIZE)
    window = large_side + 2 * _WINDOW_PAD
    out: list[_Template] = []
    for shape, size in itertools.product(SHAPES, SIZES):
        side = object_box("center", size, JUDGE_SIZE)[2]
        offset = _WINDOW_PAD + (large_side - side) // 2
        for dy, dx in itertools.product(_SHIFTS, _SHIFTS):
            mask = np.zeros((window, window), dtype=bool)
            mask[offset + dy : offset + dy + side, offset + dx : offset + dx + side] = shape_mask(shape, side)
            out.append(_Template(shape, size, mask))
    sharp = np.stack([t.mask for t in out]).astype(np.float64)
    blurred = _box_blur(sharp)
    very_blurred = _box_blur(blurred)
    soft = [np.clip(b / _OBJECTNESS_SCALE, 0.0, 1.0) for b in (blurred, very_blurred)]
    return tuple(out), np.concatenate([sharp, *soft]).reshape(3 * len(out), -1)


@lru_cache(maxsize=None)
def _squared_norms() -> np.ndarray:
    """``[3T]`` squared norms of the soft templates."""
    return (_templates()[1] ** 2).sum(axis=1)


def _cell_window(position: str) -> tuple[slice, slice]:
    """Pixel slices (rows, cols) of the search window of a cell."""
    x0, y0, side = object_box(position, "large", JUDGE_SIZE)
    pad = _WINDOW_PAD
    return slice(y0 - pad, y0 + side + pad), slice(x0 - pad, x0 + side + pad)


def _erode(mask: np.ndarray) -> np.ndarray:
    """3 x 3 binary erosion of ``[h, w]`` bool (outside counts as empty)."""
    padded = np.pad(mask, 1)
    h, w = mask.shape
    out = np.ones_like(mask)
    for dy, dx in itertools.product(range(3), range(3)):
        out &= padded[dy : dy + h, dx : dx + w]
    return out


def _classify_color(pixels: np.ndarray) -> str:
    """Palette colour of ``[N, 3]`` object pixels: chroma-weighted vote of nearest palette hues."""
    hues, weights = _hue(pixels), _chroma(pixels)
    distance = np.abs((hues[:, None] - _PALETTE_HUES[None, :] + 180.0) % 360.0 - 180.0)  # [N, C]
    votes = np.bincount(distance.argmin(axis=1), weights=weights, minlength=len(_PALETTE_NAMES))
    return _PALETTE_NAMES[int(votes.argmax())]


def _classify_fill(pixels: np.ndarray, color: str) -> str:
    """Fill of an object from its inner pixels ``[N, 3]``: which shades of ``color`` they show."""
    base, dark, darker = speckle_shades(color)
    shades = np.array([base, tint(color), dark, darker], dtype=np.float64)  # [4, 3]
    nearest = np.linalg.norm(pixels[:, None, :] - shades[None], axis=2).argmin(axis=1)
    share = np.bincount(nearest, minlength=4) / max(1, len(nearest))
    if share[1] >= _STRIPE_SHARE:
        return "striped"
    if share[2] + share[3] >= _SPECKLE_SHARE:
        return "speckled"
    return "solid"


def _parse_cell(rgb: np.ndarray, position: str) -> Optional[ShapeObject]:
    """The object in one cell of ``rgb`` ``[64, 64, 3]``, or None."""
    rows, cols = _cell_window(position)
    window = rgb[rows, cols]  # [win, win, 3]
    chroma = _chroma(window)
    seed = chroma >= _MIN_CHROMA
    if seed.sum() < 8:
        return None
    typical = float(np.percentile(chroma[seed], 90))
    objectness = np.clip(chroma / (_OBJECTNESS_SCALE * typical), 0.0, 1.0)  # [win, win]
    templates, soft_masks = _templates()  # soft_masks: [3T, win * win]
    # squared error to each template, up to the constant sum(objectness ** 2)
    error = _squared_norms() - 2.0 * (soft_masks @ objectness.ravel())  # [3T]
    template = templates[int(error.argmin()) % len(templates)]
    foreground = chroma >= 0.5 * _OBJECTNESS_SCALE * typical
    iou = (template.mask & foreground).sum() / max(1, (template.mask | foreground).sum())
    if iou < _MIN_IOU:
        return None
    body = template.mask & foreground
    color = _classify_color(window[body])
    inner = _erode(template.mask) & foreground
    if inner.sum() < 6:
        inner = body
    fill = _classify_fill(window[inner], color)
    return ShapeObject(template.shape, color, template.size, position, fill)


def parse_image(image: ImageLike) -> ParsedScene:
    """Read an image of the shapes world back into objects (reading order) and background."""
    rgb = _as_array(image)
    background, background_color = _parse_background(rgb)
    objects = tuple(obj for obj in (_parse_cell(rgb, p) for p in POSITIONS) if obj is not None)
    return ParsedScene(objects=objects, background=background, background_color=background_color)

