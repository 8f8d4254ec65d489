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

Modules: the image reader is :mod:`raydec.reference.judge.image` (``parse_image``), the text
reader :mod:`raydec.reference.judge.text` (``parse_text``, ``parse_prompt``, ``word_kind``), the
record both fill :mod:`raydec.reference.judge.scene` (``ParsedScene``); this module scores.
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence, Union

import numpy as np

from raydec.reference.judge.image import ImageLike, parse_image
from raydec.reference.judge.scene import ParsedScene
from raydec.reference.judge.relations import check_statements
from raydec.reference.judge.text import parse_prompt, parse_text, sentences
from raydec.reference.shapes import ShapeObject, ShapesSample, words

ATTRIBUTES = ("shape", "color", "size", "position", "fill")

SceneLike = Union[ParsedScene, ShapesSample]


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
    enlarge the denominator (five each), so hallucinations cost. A dense description's count
    clauses and relations (``judge.relations``) add one point each, right or wrong. Never raises
    on odd text.
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
    statements = check_statements(sentences(words(caption) if isinstance(caption, str) else []), scene.objects)
    return (correct + sum(statements)) / (total + len(statements))


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
