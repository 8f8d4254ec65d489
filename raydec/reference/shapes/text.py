"""The shapes world's text: tokenisation, prompts, descriptions, questions and vocabulary.

All text is lower case; ``words`` splits on whitespace with ``,`` ``.`` ``?`` as tokens of
their own. ``prompt_for`` writes a scene's one-line prompt, ``describe`` several sentences
stating every attribute with phrasing and order drawn from an RNG, ``question_answers``
short (question, answer) pairs, and ``vocabulary`` every token any of them can use. The
public names are re-exported by :mod:`raydec.reference.shapes`.
"""

from __future__ import annotations

import re
from typing import Sequence

from raydec.reference.shapes.scene import (
    BACKGROUND_COLORS,
    BACKGROUNDS,
    COLORS,
    FILLS,
    NUMBER_WORDS,
    POSITIONS,
    SHAPES,
    SIZES,
    RandomSource,
    ShapeObject,
    ShapesSample,
    pick,
    randint,
    shuffled,
)

_SIZE_WORDS = {"small": ("small", "little"), "large": ("large", "big")}
_FILL_ADJECTIVES = {"solid": ("solid",), "striped": ("striped",), "speckled": ("speckled", "spotted")}
_FILL_WITH = {
    "solid": ("with a solid fill",),
    "striped": ("with stripes",),
    "speckled": ("with speckles", "with spots"),
}


def position_phrases(position: str) -> tuple[str, ...]:
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
INTRO_WITH_BACKGROUND_TEMPLATES = (
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


def background_phrase(background: str, background_color: str, rng: RandomSource | None = None) -> str:
    """"noisy grey", "grey gradient", ... (the canonical one when ``rng`` is None)."""
    options = _BACKGROUND_PHRASES[background]
    template = options[0] if rng is None else pick(rng, options)
    return template.format(c=background_color)


def prompt_for(objects: Sequence[ShapeObject], background: str, background_color: str) -> str:
    """One line: "a large red striped circle top left, ..., on a plain grey background"."""
    parts = [f"a {o.size} {o.color} {o.fill} {o.shape} {o.position}" for o in objects]
    parts.append(f"on a {background_phrase(background, background_color)} background")
    return ", ".join(parts)


def count_words(count: int, rng: RandomSource) -> dict[str, str]:
    """Agreement fields for a count: ``n``, ``noun``, ``be``, ``them``."""
    noun = pick(rng, ("object", "shape"))
    return {
        "n": NUMBER_WORDS[count],
        "noun": noun if count == 1 else noun + "s",
        "be": "is" if count == 1 else "are",
        "them": "it" if count == 1 else "them",
    }


def object_sentence(obj: ShapeObject, rng: RandomSource, templates: Sequence[str] = _OBJECT_TEMPLATES) -> str:
    """One (or two) sentences stating all five attributes of ``obj`` in one of ``templates``."""
    return pick(rng, templates).format(
        size=pick(rng, _SIZE_WORDS[obj.size]),
        color=obj.color,
        fill=pick(rng, _FILL_ADJECTIVES[obj.fill]),
        fill_with=pick(rng, _FILL_WITH[obj.fill]),
        shape=obj.shape,
        pos=pick(rng, position_phrases(obj.position)),
    )


def describe(
    objects: Sequence[ShapeObject], background: str, background_color: str, rng: RandomSource
) -> str:
    """Several sentences stating every attribute, with phrasing and order drawn from ``rng``."""
    fields = count_words(len(objects), rng)
    bg = background_phrase(background, background_color, rng)
    object_sentences = [object_sentence(o, rng) for o in shuffled(rng, objects)]
    if randint(rng, 2):
        sentences = [pick(rng, INTRO_WITH_BACKGROUND_TEMPLATES).format(bg=bg, **fields), *object_sentences]
    else:
        background_sentence = pick(rng, _BACKGROUND_TEMPLATES).format(bg=bg, **fields)
        intro = pick(rng, _INTRO_TEMPLATES).format(**fields)
        if randint(rng, 2):
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
    return f"the {obj.shape} {pick(rng, position_phrases(obj.position))}"


def question_answers(sample: ShapesSample, rng: RandomSource) -> list[tuple[str, str]]:
    """Short (question, answer) pairs about ``sample``, phrasing and order drawn from ``rng``.

    ``rng`` may be a ``numpy.random.Generator`` or a ``random.Random``.
    """
    q = _QUESTION_TEMPLATES
    pairs = [
        (pick(rng, q["count"]), NUMBER_WORDS[len(sample.objects)]),
        (pick(rng, q["background_color"]), sample.background_color),
        (pick(rng, q["background"]), sample.background),
    ]
    for obj in sample.objects:
        ref = _reference(obj, sample.objects, rng)
        pairs += [
            (pick(rng, q["color"]).format(ref=ref), obj.color),
            (pick(rng, q["size"]).format(ref=ref), obj.size),
            (pick(rng, q["position"]).format(ref=ref), obj.position),
            (pick(rng, q["fill"]).format(ref=ref), obj.fill),
            (pick(rng, q["shape"]).format(pos=pick(rng, position_phrases(obj.position))), obj.shape),
            (pick(rng, q["exists"]).format(color=obj.color, shape=obj.shape), "yes"),
        ]
    absent = ShapeObject(pick(rng, SHAPES), pick(rng, tuple(COLORS)), "small", "center", "solid")
    if not any(o.shape == absent.shape and o.color == absent.color for o in sample.objects):
        pairs.append((pick(rng, q["exists"]).format(color=absent.color, shape=absent.shape), "no"))
    return shuffled(rng, pairs)


def vocabulary() -> list[str]:
    """Every token (see ``words``) that prompts, descriptions, questions and answers can contain."""
    texts: list[str] = [*SHAPES, *COLORS, *SIZES, *POSITIONS, *FILLS, *BACKGROUNDS, *BACKGROUND_COLORS]
    texts += [*NUMBER_WORDS, *_ANSWER_WORDS, "a on background object objects shape shapes it them", ", . ?"]
    for table in (_SIZE_WORDS, _FILL_ADJECTIVES, _FILL_WITH, _BACKGROUND_PHRASES):
        texts += [phrase for options in table.values() for phrase in options]
    texts += [phrase for position in POSITIONS for phrase in position_phrases(position)]
    texts += [*_INTRO_TEMPLATES, *INTRO_WITH_BACKGROUND_TEMPLATES]
    texts += [*_OBJECT_TEMPLATES, *_BACKGROUND_TEMPLATES]
    texts += [t for options in _QUESTION_TEMPLATES.values() for t in options]
    tokens = {token for text in texts for token in words(re.sub(r"\{\w+\}", " ", text))}
    return sorted(tokens)
