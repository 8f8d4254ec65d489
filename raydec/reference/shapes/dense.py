"""Dense descriptions of a shapes scene: every object, counts, and relations between objects.

The answer to "describe the image in detail ." (``DENSE_INSTRUCTION``): an overview with the
background; one sentence per object with all five attributes, its place first
(``DENSE_OBJECT_TEMPLATES``), each but the first followed by its horizontal, vertical, size and
colour relation to the object named just before it ("compared with the blue square at the top ,
the red circle in the top left is to the left of it , larger than it , ..."); then count
sentences ("two of them are red and one is blue ."). The objects' order, the order of the count
sentences and of the relations, and the phrasing are drawn from an RNG, so temperature-1 sampling
has real choices; which words are true is decided by the image far into the answer. Three objects
give about 150-185 tokens, two about 100-125, one about 20-30.

Every sentence decides only what the answer has just put within reach: an object's colour and
shape are said after its place, a relation names both objects with their places before it
decides anything, and a count sentence states values in order of first mention.

Sentence kinds the judge tells apart (``raydec.reference.judge.relations``):

- count sentences contain ``them`` (``two of them are red`` / ``all of them are ...``);
- relation sentences contain a relation phrase (``RELATION_PHRASES``): "compared with B , A is P1
  it , P2 it and P3 it", each phrase relating A to B;
- everything else is read like a short description.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from raydec.reference.shapes.scene import (
    NUMBER_WORDS,
    SHAPES,
    RandomSource,
    ShapeObject,
    ShapesSample,
    pick,
    shuffled,
)
from raydec.reference.shapes.text import (
    INTRO_WITH_BACKGROUND_TEMPLATES,
    background_phrase,
    count_words,
    object_sentence,
    position_phrases,
)

DENSE_INSTRUCTION = "describe the image in detail ."
# position first: the place is said before what is there, so colour and shape are read at one
# place of the image; said after them, a small model mixes up which object it is describing
DENSE_OBJECT_TEMPLATES = (
    "{pos} there is a {size} {fill} {color} {shape}.",
    "{pos} sits a {size} {color} {shape} {fill_with}.",
    "{pos} is a {size} {color} {fill} {shape}.",
    "{pos} there is a {color} {shape}. it is {size} and {fill}.",
)
_DENSE_STREAM = 3  # dense-description randomness: default_rng([seed, 3])

# relation kind -> truth value -> phrasings ("A is {phrase} it", it being B)
RELATION_PHRASES: dict[str, dict[str, tuple[str, ...]]] = {
    "horizontal": {
        "left": ("to the left of", "left of"),
        "right": ("to the right of", "right of"),
        "same": ("in the same column as",),
    },
    "vertical": {
        "above": ("above", "higher up than"),
        "below": ("below", "lower down than"),
        "same": ("in the same row as", "level with"),
    },
    "size": {
        "larger": ("larger than", "bigger than"),
        "smaller": ("smaller than",),
        "same": ("the same size as",),
    },
    "color": {
        "same": ("the same colour as",),
        "different": ("a different colour from",),
    },
}
RELATION_KINDS = tuple(RELATION_PHRASES)

SHAPE_PLURALS = {s: s + "es" if s.endswith("s") else s + "s" for s in SHAPES}
_ROW = {"top": 0, "bottom": 2}
_COLUMN = {"left": 0, "right": 2}


def grid_cell(position: str) -> tuple[int, int]:
    """``(row, column)`` on the 3 x 3 grid of a position name ("top left" -> (0, 0))."""
    parts = position.split()
    row = next((_ROW[p] for p in parts if p in _ROW), 1)
    column = next((_COLUMN[p] for p in parts if p in _COLUMN), 1)
    return row, column


def relation(kind: str, a: ShapeObject, b: ShapeObject) -> str:
    """The true value of relation ``kind`` of ``a`` to ``b`` (a key of ``RELATION_PHRASES[kind]``)."""
    (row_a, col_a), (row_b, col_b) = grid_cell(a.position), grid_cell(b.position)
    if kind == "horizontal":
        return "left" if col_a < col_b else "right" if col_a > col_b else "same"
    if kind == "vertical":
        return "above" if row_a < row_b else "below" if row_a > row_b else "same"
    if kind == "size":
        return "same" if a.size == b.size else "larger" if a.size == "large" else "smaller"
    if kind == "color":
        return "same" if a.color == b.color else "different"
    raise ValueError(f"unknown relation kind {kind!r}; expected one of {RELATION_KINDS}")


def reference(obj: ShapeObject, rng: RandomSource) -> str:
    """A noun phrase that picks ``obj`` out by colour, shape and place ("the red circle in the top
    left"): copied from what its own sentence said, unique because no two objects share a place."""
    return f"the {obj.color} {obj.shape} {pick(rng, position_phrases(obj.position))}"


def _count_sentence(values: list[str], noun_plural: dict[str, str] | None) -> str:
    """"two of them are red and one is blue ." over the objects' ``values`` of one attribute, in
    order of first mention."""
    counts = Counter(values)
    if len(counts) == 1:
        (value,) = counts
        said = noun_plural[value] if noun_plural else value
        everyone = "both" if len(values) == 2 else "all"
        return f"{everyone} of them are {said} ."
    parts = []
    for i, (value, count) in enumerate(counts.items()):
        said = (noun_plural[value] if count > 1 else f"a {value}") if noun_plural else value
        verb = "are" if count > 1 else "is"
        parts.append(f"{NUMBER_WORDS[count]} of them {verb} {said}" if i == 0 else f"{NUMBER_WORDS[count]} {verb} {said}")
    return " and ".join(parts) + " ."


def _relation_sentence(a: ShapeObject, b: ShapeObject, kinds: Sequence[str], rng: RandomSource) -> str:
    """"compared with B , A is P1 it , P2 it and P3 it ." stating ``kinds`` relations of ``a`` to
    ``b``: both objects and their places are said before any relation is decided."""
    phrases = [f"{pick(rng, RELATION_PHRASES[k][relation(k, a, b)])} it" for k in kinds]
    listed = " and ".join([" , ".join(phrases[:-1]), phrases[-1]]) if len(phrases) > 1 else phrases[0]
    return f"compared with {reference(b, rng)} , {reference(a, rng)} is {listed} ."


def describe_dense(
    objects: Sequence[ShapeObject], background: str, background_color: str, rng: RandomSource
) -> str:
    """The dense description of a scene: overview, each object with its relations to the one
    before, counts."""
    fields = count_words(len(objects), rng)
    bg = background_phrase(background, background_color, rng)
    sentences = [pick(rng, INTRO_WITH_BACKGROUND_TEMPLATES).format(bg=bg, **fields)]
    # counts and relations restate what the answer has already said, in the order it said it,
    # as a careful describer (and a small model) would
    named = shuffled(rng, objects)
    for previous, obj in zip([None, *named], named):
        sentences.append(object_sentence(obj, rng, DENSE_OBJECT_TEMPLATES))
        if previous is None:
            continue
        # right after an object's sentence: how it stands to the object named before it
        sentences.append(_relation_sentence(obj, previous, shuffled(rng, RELATION_KINDS), rng))
    if len(named) > 1:
        counted = shuffled(rng, ("color", "shape", "size", "fill"))
        for attribute in counted:
            values = [getattr(o, attribute) for o in named]
            sentences.append(_count_sentence(values, SHAPE_PLURALS if attribute == "shape" else None))
    return " ".join(sentences)


def dense_description(sample: ShapesSample) -> str:
    """The dense description of ``sample`` (its own seeded stream: same seed, same text)."""
    rng = np.random.default_rng([sample.seed, _DENSE_STREAM])
    return describe_dense(sample.objects, sample.background, sample.background_color, rng)


def dense_vocabulary() -> list[str]:
    """Tokens (see ``shapes.words``) of dense descriptions and their instruction that short
    ones never use, sorted: a tokenizer appends them after ``shapes.vocabulary()``."""
    from raydec.reference.shapes.text import vocabulary, words

    texts = [DENSE_INSTRUCTION, "all both of them are and one is it compared with ,", *SHAPE_PLURALS.values()]
    texts += [p for table in RELATION_PHRASES.values() for options in table.values() for p in options]
    short = set(vocabulary())
    return sorted({w for text in texts for w in words(text)} - short)
