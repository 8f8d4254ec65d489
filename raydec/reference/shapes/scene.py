"""What a shapes-world scene is, and how one is drawn.

The world's constants (shapes, palette, sizes, grid positions, fills, backgrounds, textures,
the held-out seed range and the random streams), the ``ShapeObject`` / ``ShapesSample``
records, the small RNG helpers that accept either a ``numpy.random.Generator`` or a
``random.Random``, and ``random_scene``, the seeded draw of a scene's objects and background.
Rendering lives in :mod:`raydec.reference.shapes.render`, text in
:mod:`raydec.reference.shapes.text`; :mod:`raydec.reference.shapes` is the world's public face
(it re-exports the public names).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

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

RENDER_STREAM = 1  # render randomness: default_rng([seed, 1])
TEXT_STREAM = 2  # description randomness: default_rng([seed, 2])
# "runs" texture: a random block keeps its left neighbour's value with this probability.
RUNS_STAY = 0.55
TEXTURES = ("iid", "runs")

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


# ----------------------------------------------------------------------------- sampling


def randint(rng: RandomSource, n: int) -> int:
    """Uniform integer in ``[0, n)`` from a numpy Generator or a ``random.Random``."""
    if isinstance(rng, random.Random):
        return rng.randrange(n)
    return int(rng.integers(0, n))


def pick(rng: RandomSource, options: Sequence):
    """One uniformly chosen element of ``options``."""
    return options[randint(rng, len(options))]


def shuffled(rng: RandomSource, items: Sequence) -> list:
    """A Fisher-Yates shuffled copy of ``items``."""
    out = list(items)
    for i in range(len(out) - 1, 0, -1):
        j = randint(rng, i + 1)
        out[i], out[j] = out[j], out[i]
    return out


def random_scene(rng: RandomSource) -> tuple[tuple[ShapeObject, ...], str, str]:
    """Draw ``(objects in reading order, background, background_color)``."""
    count = 1 + randint(rng, MAX_OBJECTS)
    cells = sorted(shuffled(rng, range(len(POSITIONS)))[:count])
    objects = tuple(
        ShapeObject(
            shape=pick(rng, SHAPES),
            color=pick(rng, tuple(COLORS)),
            size=pick(rng, SIZES),
            position=POSITIONS[cell],
            fill=pick(rng, FILLS),
        )
        for cell in cells
    )
    return objects, pick(rng, BACKGROUNDS), pick(rng, tuple(BACKGROUND_COLORS))
