"""The judge's reader of dense descriptions' count and relation sentences.

Dense descriptions (:mod:`raydec.reference.shapes.dense`) add two sentence kinds to the short
ones: counts ("two of them are red and one is blue .") and relations between two objects
("compared with the blue square at the top , the red circle in the top left is to the left of it
and larger than it ."). ``judge.text.statement_kind``
tells them apart, so that the attribute reader skips them; ``check_statements`` scores each
stated count and relation against a scene: a count is right when that many objects have the value; a
relation is right when each side names exactly one of the scene's objects and the relation
holds between them. Unreadable text is ignored, never raised on.
"""

from __future__ import annotations

from typing import Optional, Sequence

from raydec.reference.judge.text import (
    COUNT_WORDS,
    EVERY,
    SHAPE_WORDS,
    find_phrase,
    object_keyword,
    position_of,
    statement_kind,
)
from raydec.reference.shapes import ShapeObject
from raydec.reference.shapes.dense import relation


def _constraints(tokens: Sequence[str]) -> dict[str, str]:
    """Attributes a noun phrase states ("the large red circle in the top left" -> shape, ...)."""
    said: dict[str, str] = {}
    for token in tokens:
        if token in SHAPE_WORDS:
            said.setdefault("shape", SHAPE_WORDS[token])
        keyword = object_keyword(token)
        if keyword is not None:
            said.setdefault(*keyword)
    position = position_of(said.pop("vertical", None), said.pop("horizontal", None), said.pop("center", None) is not None)
    if position is not None:
        said["position"] = position
    return said


def _resolve(tokens: Sequence[str], objects: Sequence[ShapeObject]) -> Optional[ShapeObject]:
    """The one object of ``objects`` the noun phrase ``tokens`` names, or None."""
    said = _constraints(tokens)
    if "shape" not in said:
        return None
    matches = [o for o in objects if all(getattr(o, k) == v for k, v in said.items())]
    return matches[0] if len(matches) == 1 else None


def _check_relations(sentence: Sequence[str], objects: Sequence[ShapeObject]) -> list[bool]:
    """One verdict per relation phrase, each relating A to B: "compared with B , A is P1 it , P2 it
    and P3 it", or "A is P1 B [and P2 it]"."""
    first = find_phrase(sentence, 0)
    if first is None:
        return []
    begin, end, kind, value = first
    stated = [(kind, value)]
    cursor = end
    while (found := find_phrase(sentence, cursor)) is not None:
        stated.append(found[2:])
        cursor = found[1]
    head = list(sentence[:begin])
    subject = head[: head.index("is")] if "is" in head else head
    if sentence[:2] == ["compared", "with"] and "," in subject:
        comma = subject.index(",")
        a, b = _resolve(subject[comma + 1 :], objects), _resolve(subject[2:comma], objects)
    else:
        rest = list(sentence[end:])
        stop = rest.index("and") if "and" in rest else len(rest)
        a, b = _resolve(subject, objects), _resolve(rest[:stop], objects)
    if a is None or b is None or a is b:
        return [False] * len(stated)
    return [relation(k, a, b) == v for k, v in stated]


def _check_counts(sentence: Sequence[str], objects: Sequence[ShapeObject]) -> list[bool]:
    """One verdict per clause of "two of them are red and one is blue" / "all of them are small"."""
    verdicts = []
    clauses: list[list[str]] = [[]]
    for token in sentence:
        if token == "and":
            clauses.append([])
        else:
            clauses[-1].append(token)
    for clause in clauses:
        if not clause:
            continue
        said = {k: v for k, v in _constraints(clause).items() if k != "position"}
        if len(said) != 1:
            verdicts.append(False)
            continue
        ((attribute, value),) = said.items()
        have = sum(getattr(o, attribute) == value for o in objects)
        expected = len(objects) if clause[0] in EVERY else COUNT_WORDS.get(clause[0], -1)
        verdicts.append(have == expected)
    return verdicts


def verdicts_by_kind(sentences: Sequence[Sequence[str]], objects: Sequence[ShapeObject]) -> dict[str, list[bool]]:
    """A verdict for every count clause and relation stated in ``sentences`` about ``objects``, by
    sentence kind: {"count": [...], "relation": [...]}, each in the order stated."""
    verdicts: dict[str, list[bool]] = {"count": [], "relation": []}
    for sentence in sentences:
        kind = statement_kind(sentence)
        if kind == "count":
            verdicts[kind] += _check_counts(sentence, objects)
        elif kind == "relation":
            verdicts[kind] += _check_relations(sentence, objects)
    return verdicts


def check_statements(sentences: Sequence[Sequence[str]], objects: Sequence[ShapeObject]) -> list[bool]:
    """A verdict for every count clause and relation stated in ``sentences`` about ``objects``, in
    the order stated."""
    return [v for sentence in sentences for said in verdicts_by_kind([sentence], objects).values() for v in said]
