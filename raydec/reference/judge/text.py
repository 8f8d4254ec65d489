"""The judge's text reader: prompts and captions into stated objects and background, by keyword rules.

``parse_text`` / ``parse_prompt`` know the description templates of
:mod:`raydec.reference.shapes.text` (synonyms, position phrases, "it is ..." follow-ups); each
attribute word goes to the nearest shape noun of its sentence, and anything they do not
understand is ignored, so garbled text scores low and never raises. ``word_kind`` names which
scene attribute a token states, from the same word lists. Dense descriptions' count and
relation sentences (``statement_kind``) are skipped here and checked by
:mod:`raydec.reference.judge.relations`.
"""

from __future__ import annotations

from typing import Optional, Sequence

from raydec.reference.judge.scene import ParsedScene
from raydec.reference.shapes import BACKGROUND_COLORS, COLORS, SHAPES, ShapeObject, words
from raydec.reference.shapes.dense import RELATION_PHRASES, SHAPE_PLURALS

SHAPE_WORDS = {**{s: s for s in SHAPES}, **{plural: s for s, plural in SHAPE_PLURALS.items()}}
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
COUNT_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "1": 1, "2": 2, "3": 3}
_SENTENCE_ENDS = {".", "?", "!"}
_MAX_TEXT_OBJECTS = 8  # mentions beyond this are ignored (keeps matching cheap)


WORD_KINDS = ("colour", "shape", "fill", "size", "position", "background", "count", "relation", "other")
# words of dense descriptions' relation phrases that state the relation's value
_RELATION_WORDS = {"above", "below", "higher", "larger", "bigger", "smaller", "same", "different", "column", "row",
                   "level"}  # fmt: skip
EVERY = {"all", "both"}
# token tuple -> (kind, value), longest first so "to the left of" wins over "left of"
_PHRASES = sorted(
    ((tuple(p.split()), (kind, value)) for kind, table in RELATION_PHRASES.items()
     for value, phrases in table.items() for p in phrases),
    key=lambda item: -len(item[0]),
)  # fmt: skip


def statement_kind(sentence: Sequence[str]) -> Optional[str]:
    """"count", "relation" or None (a sentence the attribute reader handles)."""
    if "them" in sentence and sentence and (sentence[0] in COUNT_WORDS or sentence[0] in EVERY):
        return "count"
    if find_phrase(sentence, 0) is not None:
        return "relation"
    return None


def find_phrase(sentence: Sequence[str], start: int) -> Optional[tuple[int, int, str, str]]:
    """The first relation phrase at or after ``start``: ``(begin, end, kind, value)``."""
    for i in range(start, len(sentence)):
        for tokens, (kind, value) in _PHRASES:
            if tuple(sentence[i : i + len(tokens)]) == tokens:
                return i, i + len(tokens), kind, value
    return None





def word_kind(word: str) -> str:
    """Which scene attribute a text token names (one of ``WORD_KINDS``; "other": phrasing).

    The same word lists the caption parser reads, so "other" words are those no image can decide.
    """
    kinds = (
        ("colour", _COLOR_WORDS), ("shape", SHAPE_WORDS), ("fill", _FILL_WORDS), ("size", _SIZE_WORDS),
        ("position", {**_VERTICAL_WORDS, **_HORIZONTAL_WORDS, **dict.fromkeys(_CENTER_WORDS)}),
        ("background", {**_BACKGROUND_COLOR_WORDS, **_BACKGROUND_WORDS}),
        ("count", {**COUNT_WORDS, **dict.fromkeys(EVERY)}), ("relation", _RELATION_WORDS),
    )  # fmt: skip
    return next((kind for kind, words in kinds if word in words), "other")


def position_of(vertical: Optional[str], horizontal: Optional[str], center: bool) -> Optional[str]:
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
        position = position_of(self.get("vertical"), self.get("horizontal"), self.get("center") is not None)
        return ShapeObject(
            shape=self.get("shape"), color=self.get("color"), size=self.get("size"),
            position=position, fill=self.get("fill"),
        )  # type: ignore[arg-type]  # fmt: skip


def sentences(tokens: list[str]) -> list[list[str]]:
    """Split tokens at ``.`` ``?`` ``!``."""
    out: list[list[str]] = [[]]
    for token in tokens:
        if token in _SENTENCE_ENDS:
            out.append([])
        else:
            out[-1].append(token)
    return [s for s in out if s]


def object_keyword(token: str) -> Optional[tuple[str, str]]:
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
    for sentence in sentences(tokens):
        if statement_kind(sentence) is not None:  # dense counts and relations: judge.relations
            continue
        nouns = [(i, SHAPE_WORDS[t]) for i, t in enumerate(sentence) if t in SHAPE_WORDS]
        local = [_Mention(shape) for _, shape in nouns][: max(0, _MAX_TEXT_OBJECTS - len(mentions))]
        nouns = nouns[: len(local)]
        for i, token in enumerate(sentence):
            if token in _BACKGROUND_COLOR_WORDS:
                background_color = background_color or _BACKGROUND_COLOR_WORDS[token]
            elif token in _BACKGROUND_WORDS:
                background = background or _BACKGROUND_WORDS[token]
            elif token in COUNT_WORDS and count is None:
                count = COUNT_WORDS[token]
            keyword = object_keyword(token)
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

