"""A classical (non-learned) judge for the shapes world: our GenEval / CLIP score.

``parse_image`` reads an image back into objects and attributes with fixed rules that lean
on the world's structure and are tolerant of blur, colour quantisation and a few wrong tokens:

* **Background**: block rows / columns 0, 5, 10 and 15 never hold an object. The centres of
  those blocks give the background grey level (nearest named level), and a straight-line fit
  of their brightness against the row tells "plain" (flat), "gradient" (sloped, smooth) and
  "noisy" (many blocks far off the fit) apart.
* **Objects**: objects are saturated colours on an achromatic background, so chroma
  (max - min channel) is the foreground signal. In each of the nine cells, the foreground
  mask is matched against every (shape, size) template at small shifts; the best
  intersection-over-union gives shape and size.
* **Colour**: hue (which shading and tinting preserve) voted over the object's pixels,
  nearest palette hue.
* **Fill**: the object's inner pixels are classified into its colour's shades: the light
  tint means "striped", the 3/4 and 1/2 shades mean "speckled", the full colour alone "solid".

``parse_prompt`` / ``parse_text`` read prompts and captions with keyword rules that know the
description templates (synonyms, position phrases, "it is ..." follow-ups); anything they do
not understand is ignored, so garbled text scores low and never raises.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence, Union

import numpy as np
from PIL import Image

from raydec.reference.shapes import (
    BACKGROUND_COLORS,
    BACKGROUND_SPREAD,
    COLORS,
    GRID_BLOCKS,
    POSITIONS,
    SHAPES,
    SIZES,
    ShapeObject,
    ShapesSample,
    object_box,
    shape_mask,
    speckle_shades,
    tint,
    words,
)

logger = logging.getLogger(__name__)

JUDGE_SIZE = 64  # images of other sizes are resized to this
ATTRIBUTES = ("shape", "color", "size", "position", "fill")
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


@dataclass(frozen=True)
class ParsedScene:
    """A scene read from an image (all fields set) or from text (unstated fields are None)."""

    objects: tuple[ShapeObject, ...]
    background: Optional[str]
    background_color: Optional[str]
    count: Optional[int] = None  # a stated object count (text only)


SceneLike = Union[ParsedScene, ShapesSample]
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


# ----------------------------------------------------------------------------- text

_SHAPE_WORDS = {**{s: s for s in SHAPES}, **{s + "s": s for s in SHAPES if s != "cross"}, "crosses": "cross"}
_COLOR_WORDS = {c: c for c in COLORS}
_SIZE_WORDS = {"small": "small", "little": "small", "tiny": "small", "large": "large", "big": "large"}
_FILL_WORDS = {
    "solid": "solid", "filled": "solid",
    "striped": "striped", "stripes": "striped", "stripy": "striped",
    "speckled": "speckled", "speckles": "speckled", "spotted": "speckled", "spots": "speckled",
    "dotted": "speckled",
}  # fmt: skip
_VERTICAL_WORDS = {"top": "top", "upper": "top", "bottom": "bottom", "lower": "bottom"}
_HORIZONTAL_WORDS = {"left": "left", "right": "right"}
_CENTER_WORDS = {"center", "centre", "middle"}
_BACKGROUND_COLOR_WORDS = {**{c: c for c in BACKGROUND_COLORS}, "gray": "grey"}
_BACKGROUND_WORDS = {
    "plain": "plain", "flat": "plain", "uniform": "plain",
    "gradient": "gradient", "shaded": "gradient",
    "noisy": "noisy", "grainy": "noisy", "textured": "noisy",
}  # fmt: skip
_COUNT_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "1": 1, "2": 2, "3": 3}
_SENTENCE_ENDS = {".", "?", "!"}
_MAX_TEXT_OBJECTS = 8  # mentions beyond this are ignored (keeps matching cheap)


WORD_KINDS = ("colour", "shape", "fill", "size", "position", "background", "count", "other")


def word_kind(word: str) -> str:
    """Which scene attribute a text token names (one of ``WORD_KINDS``; "other": phrasing).

    The same word lists the caption parser reads, so "other" words are those no image can decide.
    """
    kinds = (
        ("colour", _COLOR_WORDS), ("shape", _SHAPE_WORDS), ("fill", _FILL_WORDS), ("size", _SIZE_WORDS),
        ("position", {**_VERTICAL_WORDS, **_HORIZONTAL_WORDS, **dict.fromkeys(_CENTER_WORDS)}),
        ("background", {**_BACKGROUND_COLOR_WORDS, **_BACKGROUND_WORDS}), ("count", _COUNT_WORDS),
    )  # fmt: skip
    return next((kind for kind, words in kinds if word in words), "other")


def _position_of(vertical: Optional[str], horizontal: Optional[str], center: bool) -> Optional[str]:
    """Combine position keywords ("upper" + "left" -> "top left"); None if nothing was said."""
    if vertical and horizontal:
        return f"{vertical} {horizontal}"
    if vertical or horizontal:
        return vertical or horizontal
    return "center" if center else None


class _Mention:
    """Attributes gathered for one object mention: per attribute the value nearest the noun."""

    def __init__(self, shape: str) -> None:
        self.values: dict[str, tuple[int, str]] = {"shape": (0, shape)}

    def offer(self, attribute: str, value: str, distance: int) -> None:
        """Keep ``value`` unless a nearer one for ``attribute`` is already known."""
        if attribute not in self.values or distance < self.values[attribute][0]:
            self.values[attribute] = (distance, value)

    def get(self, attribute: str) -> Optional[str]:
        return self.values[attribute][1] if attribute in self.values else None

    def to_object(self) -> ShapeObject:
        position = _position_of(self.get("vertical"), self.get("horizontal"), self.get("center") is not None)
        return ShapeObject(
            shape=self.get("shape"), color=self.get("color"), size=self.get("size"),
            position=position, fill=self.get("fill"),
        )  # type: ignore[arg-type]  # fmt: skip


def _sentences(tokens: list[str]) -> list[list[str]]:
    """Split tokens at ``.`` ``?`` ``!``."""
    out: list[list[str]] = [[]]
    for token in tokens:
        if token in _SENTENCE_ENDS:
            out.append([])
        else:
            out[-1].append(token)
    return [s for s in out if s]


def _object_keyword(token: str) -> Optional[tuple[str, str]]:
    """``(attribute, value)`` if ``token`` states an object attribute."""
    for attribute, table in (("color", _COLOR_WORDS), ("size", _SIZE_WORDS), ("fill", _FILL_WORDS),
                             ("vertical", _VERTICAL_WORDS), ("horizontal", _HORIZONTAL_WORDS)):  # fmt: skip
        if token in table:
            return attribute, table[token]
    if token in _CENTER_WORDS:
        return "center", "center"
    return None


def parse_text(text: str) -> ParsedScene:
    """Read a prompt or caption into stated objects (unstated attributes None) and background.

    Each attribute word goes to the nearest shape noun of its sentence (ties: the earlier
    noun); a sentence without a shape noun ("it is small and striped.") continues the last
    object. Background colour / kind words and number words are global. Never raises.
    """
    tokens = words(text) if isinstance(text, str) else []
    mentions: list[_Mention] = []
    background = background_color = None
    count: Optional[int] = None
    for sentence in _sentences(tokens):
        nouns = [(i, _SHAPE_WORDS[t]) for i, t in enumerate(sentence) if t in _SHAPE_WORDS]
        local = [_Mention(shape) for _, shape in nouns][: max(0, _MAX_TEXT_OBJECTS - len(mentions))]
        nouns = nouns[: len(local)]
        for i, token in enumerate(sentence):
            if token in _BACKGROUND_COLOR_WORDS:
                background_color = background_color or _BACKGROUND_COLOR_WORDS[token]
            elif token in _BACKGROUND_WORDS:
                background = background or _BACKGROUND_WORDS[token]
            elif token in _COUNT_WORDS and count is None:
                count = _COUNT_WORDS[token]
            keyword = _object_keyword(token)
            if keyword is None:
                continue
            if local:
                nearest = min(range(len(nouns)), key=lambda k: (abs(nouns[k][0] - i), nouns[k][0]))
                local[nearest].offer(*keyword, abs(nouns[nearest][0] - i))
            elif mentions:
                mentions[-1].offer(*keyword, len(tokens))
        mentions.extend(local)
    objects = tuple(m.to_object() for m in mentions)
    return ParsedScene(objects=objects, background=background, background_color=background_color, count=count)


def parse_prompt(prompt: str) -> ParsedScene:
    """Read a prompt written by ``shapes.prompt_for`` (or anything close to it)."""
    return parse_text(prompt)


# ----------------------------------------------------------------------------- scoring


def _agreement(stated: ShapeObject, actual: ShapeObject) -> int:
    """Number of attributes of ``stated`` that are set and equal in ``actual``."""
    return sum(
        getattr(stated, a) is not None and getattr(stated, a) == getattr(actual, a) for a in ATTRIBUTES
    )


def _best_matching(stated: Sequence[ShapeObject], actual: Sequence[ShapeObject]) -> int:
    """Most agreeing attributes over one-to-one pairings of ``stated`` with ``actual`` objects."""
    if not stated or not actual:
        return 0
    table = np.array([[_agreement(s, a) for a in actual] for s in stated])  # [S, A]
    if len(stated) > len(actual):
        table = table.T
    rows, cols = table.shape
    pairings = itertools.permutations(range(cols), rows)
    return max(int(table[list(range(rows)), list(p)].sum()) for p in pairings)


def _stated_attributes(obj: ShapeObject) -> int:
    return sum(getattr(obj, a) is not None for a in ATTRIBUTES)


def _as_scene(scene: SceneLike) -> ParsedScene:
    if isinstance(scene, ShapesSample):
        return ParsedScene(scene.objects, scene.background, scene.background_color)
    return scene


def score_image(image: ImageLike, prompt: str) -> float:
    """Share of the prompt's stated attributes present in the image, in [0, 1].

    Stated attributes: every set attribute of every object (objects paired with the image's
    objects to agree most), the background kind and colour, and the object count.
    """
    stated = parse_prompt(prompt)
    parsed = parse_image(image)
    correct = _best_matching(stated.objects, parsed.objects)
    total = sum(_stated_attributes(o) for o in stated.objects)
    backgrounds = ((stated.background, parsed.background), (stated.background_color, parsed.background_color))
    for said, seen in backgrounds:
        total += said is not None
        correct += said is not None and said == seen
    stated_count = stated.count if stated.count is not None else len(stated.objects)
    total += 1
    correct += stated_count == len(parsed.objects)
    return correct / total


def score_caption(
    caption: str, image: Optional[ImageLike] = None, truth: Optional[SceneLike] = None
) -> float:
    """Share of the image's attributes that ``caption`` states correctly, in [0, 1].

    The truth is ``truth`` when given, else ``parse_image(image)``. Attributes: five per
    object, background kind and colour, and the object count. Objects the caption invents
    enlarge the denominator (five each), so hallucinations cost. Never raises on odd text.
    """
    if truth is None:
        if image is None:
            raise ValueError("score_caption needs an image or a truth scene")
        truth = parse_image(image)
    scene = _as_scene(truth)
    said = parse_text(caption)
    correct = _best_matching(said.objects, scene.objects)
    correct += said.background == scene.background
    correct += said.background_color == scene.background_color
    said_count = said.count if said.count is not None else len(said.objects)
    correct += said_count == len(scene.objects)
    total = len(ATTRIBUTES) * max(len(scene.objects), len(said.objects)) + 3
    return correct / total


def attribute_accuracy(parsed: SceneLike, truth: SceneLike) -> float:
    """Share of ``truth``'s attributes that ``parsed`` gets right, objects paired by grid cell.

    Five per true object (a missing object loses all five), background kind and colour;
    every object ``parsed`` reports in an empty cell adds five wrong attributes.
    """
    parsed, truth = _as_scene(parsed), _as_scene(truth)
    found = {o.position: o for o in parsed.objects}
    correct = sum(_agreement(t, found[t.position]) for t in truth.objects if t.position in found)
    extra = len(set(found) - {t.position for t in truth.objects})
    correct += (parsed.background == truth.background) + (parsed.background_color == truth.background_color)
    total = len(ATTRIBUTES) * (len(truth.objects) + extra) + 2
    return correct / total
