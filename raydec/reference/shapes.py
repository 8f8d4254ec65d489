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
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
from PIL import Image

logger = logging.getLogger(__name__)

SHAPES = ("circle", "square", "triangle", "diamond", "cross")
# Hues ~0, 54, 116, 177, 230, 283 degrees: well separated, and shading / tinting keeps hue.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "yellow": (230, 210, 40),
    "green": (50, 180, 40),
    "cyan": (30, 200, 190),
    "blue": (40, 70, 220),
    "purple": (160, 60, 200),
}
SIZES = ("small", "large")
POSITIONS = (
    "top left", "top", "top right",
    "left", "center", "right",
    "bottom left", "bottom", "bottom right",
)  # fmt: skip
FILLS = ("solid", "striped", "speckled")
BACKGROUNDS = ("plain", "gradient", "noisy")
# Achromatic background grey levels; noisy / gradient backgrounds span level +- BACKGROUND_SPREAD.
BACKGROUND_COLORS: dict[str, int] = {"white": 224, "grey": 128, "black": 32}
BACKGROUND_SPREAD = 24
HELD_OUT_SEED_START = 1_000_000
MAX_OBJECTS = 3
GRID_BLOCKS = 16  # blocks per image side
NUMBER_WORDS = ("zero", "one", "two", "three")
# A noisy background is flat above a horizon block row drawn from these, block noise below it.
NOISE_HORIZON_ROWS = tuple(range(3, 9))

_RENDER_STREAM = 1  # render randomness: default_rng([seed, 1])
_TEXT_STREAM = 2  # description randomness: default_rng([seed, 2])
# "runs" texture: a random block keeps its left neighbour's value with this probability.
RUNS_STAY = 0.55
TEXTURES = ("iid", "runs")
_SPECKLE_MAX_BASE_SHARE = (3, 5)  # a speckled object shows its full colour on at most 3/5 of it

RandomSource = Union[np.random.Generator, random.Random]


@dataclass(frozen=True)
class ShapeObject:
    """One object of a scene."""

    shape: str
    color: str
    size: str
    position: str
    fill: str


@dataclass(frozen=True)
class ShapesSample:
    """One seeded (image, prompt, description) triple with its ground truth."""

    seed: int
    image: np.ndarray  # [H, W, 3] uint8
    objects: tuple[ShapeObject, ...]
    background: str
    background_color: str
    prompt: str
    description: str
    texture: str = "iid"


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
    rng = np.random.default_rng([seed, _RENDER_STREAM])
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


def _randint(rng: RandomSource, n: int) -> int:
    """Uniform integer in ``[0, n)`` from a numpy Generator or a ``random.Random``."""
    if isinstance(rng, random.Random):
        return rng.randrange(n)
    return int(rng.integers(0, n))


def _pick(rng: RandomSource, options: Sequence):
    """One uniformly chosen element of ``options``."""
    return options[_randint(rng, len(options))]


def _shuffled(rng: RandomSource, items: Sequence) -> list:
    """A Fisher-Yates shuffled copy of ``items``."""
    out = list(items)
    for i in range(len(out) - 1, 0, -1):
        j = _randint(rng, i + 1)
        out[i], out[j] = out[j], out[i]
    return out


def random_scene(rng: RandomSource) -> tuple[tuple[ShapeObject, ...], str, str]:
    """Draw ``(objects in reading order, background, background_color)``."""
    count = 1 + _randint(rng, MAX_OBJECTS)
    cells = sorted(_shuffled(rng, range(len(POSITIONS)))[:count])
    objects = tuple(
        ShapeObject(
            shape=_pick(rng, SHAPES),
            color=_pick(rng, tuple(COLORS)),
            size=_pick(rng, SIZES),
            position=POSITIONS[cell],
            fill=_pick(rng, FILLS),
        )
        for cell in cells
    )
    return objects, _pick(rng, BACKGROUNDS), _pick(rng, tuple(BACKGROUND_COLORS))


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
            objects, background, background_color, np.random.default_rng([seed, _TEXT_STREAM])
        ),
        texture=texture,
    )


# ----------------------------------------------------------------------------- text


_SIZE_WORDS = {"small": ("small", "little"), "large": ("large", "big")}
_FILL_ADJECTIVES = {"solid": ("solid",), "striped": ("striped",), "speckled": ("speckled", "spotted")}
_FILL_WITH = {
    "solid": ("with a solid fill",),
    "striped": ("with stripes",),
    "speckled": ("with speckles", "with spots"),
}


def _position_phrases(position: str) -> tuple[str, ...]:
    """Ways to say where an object is ("in the top left corner", "on the left", ...)."""
    if position == "center":
        return ("in the center", "in the middle")
    if position in ("left", "right"):
        return (f"on the {position}", f"on the {position} side")
    if position in ("top", "bottom"):
        return (f"at the {position}", f"near the {position}")
    vertical, horizontal = position.split()
    synonym = {"top": "upper", "bottom": "lower"}[vertical]
    return (
        f"in the {position}", f"at the {position}",
        f"in the {position} corner", f"in the {synonym} {horizontal} corner",
    )  # fmt: skip


# Background phrases as used in "on a {phrase} background"; the first one is the prompt's.
_BACKGROUND_PHRASES = {
    "plain": ("plain {c}", "flat {c}", "uniform {c}"),
    "gradient": ("{c} gradient", "smooth {c} gradient"),
    "noisy": ("noisy {c}", "grainy {c}"),
}
_INTRO_TEMPLATES = (
    "there {be} {n} {noun} in the image.",
    "the image shows {n} {noun}.",
    "this picture contains {n} {noun}.",
    "we can see {n} {noun}.",
)
_INTRO_WITH_BACKGROUND_TEMPLATES = (
    "there {be} {n} {noun} on a {bg} background.",
    "the image shows {n} {noun} on a {bg} background.",
)
_OBJECT_TEMPLATES = (
    "a {size} {color} {fill} {shape} is {pos}.",
    "{pos} there is a {size} {fill} {color} {shape}.",
    "the {shape} {pos} is {size}, {color} and {fill}.",
    "there is a {size} {color} {shape} {pos}, {fill_with}.",
    "{pos} sits a {size} {color} {shape} {fill_with}.",
    "there is a {color} {shape} {pos}. it is {size} and {fill}.",
)
_BACKGROUND_TEMPLATES = (
    "the {noun} {be} on a {bg} background.",
    "everything sits on a {bg} background.",
    "behind {them} is a {bg} background.",
)
_QUESTION_TEMPLATES = {
    "count": ("how many objects are there?", "how many shapes are in the image?"),
    "color": ("what colour is {ref}?",),
    "size": ("what size is {ref}?", "is {ref} small or large?"),
    "position": ("where is {ref}?",),
    "fill": ("what fill does {ref} have?", "is {ref} solid, striped or speckled?"),
    "shape": ("what shape is {pos}?",),
    "background_color": ("what colour is the background?",),
    "background": ("what kind of background is it?",),
    "exists": ("is there a {color} {shape}?",),
}
_ANSWER_WORDS = ("yes", "no")
_TOKEN_PATTERN = re.compile(r"([,.?])")


def words(text: str) -> list[str]:
    """Tokenise ``text``: lower case, split on whitespace, ``,`` ``.`` ``?`` as separate tokens."""
    return _TOKEN_PATTERN.sub(r" \1 ", text.lower()).split()


def _background_phrase(background: str, background_color: str, rng: RandomSource | None = None) -> str:
    """"noisy grey", "grey gradient", ... (the canonical one when ``rng`` is None)."""
    options = _BACKGROUND_PHRASES[background]
    template = options[0] if rng is None else _pick(rng, options)
    return template.format(c=background_color)


def prompt_for(objects: Sequence[ShapeObject], background: str, background_color: str) -> str:
    """One line: "a large red striped circle top left, ..., on a plain grey background"."""
    parts = [f"a {o.size} {o.color} {o.fill} {o.shape} {o.position}" for o in objects]
    parts.append(f"on a {_background_phrase(background, background_color)} background")
    return ", ".join(parts)


def _count_words(count: int, rng: RandomSource) -> dict[str, str]:
    """Agreement fields for a count: ``n``, ``noun``, ``be``, ``them``."""
    noun = _pick(rng, ("object", "shape"))
    return {
        "n": NUMBER_WORDS[count],
        "noun": noun if count == 1 else noun + "s",
        "be": "is" if count == 1 else "are",
        "them": "it" if count == 1 else "them",
    }


def _object_sentence(obj: ShapeObject, rng: RandomSource) -> str:
    """One (or two) sentences stating all five attributes of ``obj``."""
    return _pick(rng, _OBJECT_TEMPLATES).format(
        size=_pick(rng, _SIZE_WORDS[obj.size]),
        color=obj.color,
        fill=_pick(rng, _FILL_ADJECTIVES[obj.fill]),
        fill_with=_pick(rng, _FILL_WITH[obj.fill]),
        shape=obj.shape,
        pos=_pick(rng, _position_phrases(obj.position)),
    )


def describe(
    objects: Sequence[ShapeObject], background: str, background_color: str, rng: RandomSource
) -> str:
    """Several sentences stating every attribute, with phrasing and order drawn from ``rng``."""
    fields = _count_words(len(objects), rng)
    bg = _background_phrase(background, background_color, rng)
    object_sentences = [_object_sentence(o, rng) for o in _shuffled(rng, objects)]
    if _randint(rng, 2):
        sentences = [_pick(rng, _INTRO_WITH_BACKGROUND_TEMPLATES).format(bg=bg, **fields), *object_sentences]
    else:
        background_sentence = _pick(rng, _BACKGROUND_TEMPLATES).format(bg=bg, **fields)
        intro = _pick(rng, _INTRO_TEMPLATES).format(**fields)
        if _randint(rng, 2):
            sentences = [intro, background_sentence, *object_sentences]
        else:
            sentences = [intro, *object_sentences, background_sentence]
    return " ".join(sentences)


def _reference(obj: ShapeObject, objects: Sequence[ShapeObject], rng: RandomSource) -> str:
    """An unambiguous noun phrase for ``obj`` among ``objects`` ("the circle", "the red circle", ...)."""
    if sum(o.shape == obj.shape for o in objects) == 1:
        return f"the {obj.shape}"
    if sum(o.shape == obj.shape and o.color == obj.color for o in objects) == 1:
        return f"the {obj.color} {obj.shape}"
    return f"the {obj.shape} {_pick(rng, _position_phrases(obj.position))}"


def question_answers(sample: ShapesSample, rng: RandomSource) -> list[tuple[str, str]]:
    """Short (question, answer) pairs about ``sample``, phrasing and order drawn from ``rng``.

    ``rng`` may be a ``numpy.random.Generator`` or a ``random.Random``.
    """
    q = _QUESTION_TEMPLATES
    pairs = [
        (_pick(rng, q["count"]), NUMBER_WORDS[len(sample.objects)]),
        (_pick(rng, q["background_color"]), sample.background_color),
        (_pick(rng, q["background"]), sample.background),
    ]
    for obj in sample.objects:
        ref = _reference(obj, sample.objects, rng)
        pairs += [
            (_pick(rng, q["color"]).format(ref=ref), obj.color),
            (_pick(rng, q["size"]).format(ref=ref), obj.size),
            (_pick(rng, q["position"]).format(ref=ref), obj.position),
            (_pick(rng, q["fill"]).format(ref=ref), obj.fill),
            (_pick(rng, q["shape"]).format(pos=_pick(rng, _position_phrases(obj.position))), obj.shape),
            (_pick(rng, q["exists"]).format(color=obj.color, shape=obj.shape), "yes"),
        ]
    absent = ShapeObject(_pick(rng, SHAPES), _pick(rng, tuple(COLORS)), "small", "center", "solid")
    if not any(o.shape == absent.shape and o.color == absent.color for o in sample.objects):
        pairs.append((_pick(rng, q["exists"]).format(color=absent.color, shape=absent.shape), "no"))
    return _shuffled(rng, pairs)


def vocabulary() -> list[str]:
    """Every token (see ``words``) that prompts, descriptions, questions and answers can contain."""
    texts: list[str] = [*SHAPES, *COLORS, *SIZES, *POSITIONS, *FILLS, *BACKGROUNDS, *BACKGROUND_COLORS]
    texts += [*NUMBER_WORDS, *_ANSWER_WORDS, "a on background object objects shape shapes it them", ", . ?"]
    for table in (_SIZE_WORDS, _FILL_ADJECTIVES, _FILL_WITH, _BACKGROUND_PHRASES):
        texts += [phrase for options in table.values() for phrase in options]
    texts += [phrase for position in POSITIONS for phrase in _position_phrases(position)]
    texts += [*_INTRO_TEMPLATES, *_INTRO_WITH_BACKGROUND_TEMPLATES]
    texts += [*_OBJECT_TEMPLATES, *_BACKGROUND_TEMPLATES]
    texts += [t for options in _QUESTION_TEMPLATES.values() for t in options]
    tokens = {token for text in texts for token in words(re.sub(r"\{\w+\}", " ", text))}
    return sorted(tokens)
