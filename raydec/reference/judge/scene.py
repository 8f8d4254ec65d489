"""What the shapes-world judge reads a scene into: the ``ParsedScene`` record.

``parse_image`` (:mod:`raydec.reference.judge.image`) fills every field; ``parse_text``
(:mod:`raydec.reference.judge.text`) leaves unstated ones None; the scores of
:mod:`raydec.reference.judge` compare them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raydec.reference.shapes import ShapeObject


@dataclass(frozen=True)
class ParsedScene:
    """A scene read from an image (all fields set) or from text (unstated fields are None)."""

    objects: tuple[ShapeObject, ...]
    background: Optional[str]
    background_color: Optional[str]
    count: Optional[int] = None  # a stated object count (text only)

