"""A pydantic base for every raydec config: unknown keys are errors, and so are booleans
given for numbers.

Pydantic's lax mode reads ``True`` as ``1`` for an ``int`` field, so ``window: true`` in a YAML
job would quietly become a one-token window. Leaf module: imports nothing of raydec, so every
layer may use it.
"""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _takes_number_not_bool(annotation: object) -> bool:
    """True for ``int`` / ``float`` and unions of them (``int | None``), False when bool is allowed."""
    if annotation is bool:
        return False
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        return bool not in options and any(o in (int, float) for o in options)
    if typing.get_origin(annotation) is typing.Annotated:
        return _takes_number_not_bool(typing.get_args(annotation)[0])
    return False


class StrictModel(BaseModel):
    """Base for raydec configs: unknown keys are errors, values are validated on assignment,
    and a boolean given for a number is an error naming the field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, bool) and info.field_name is not None:
            if _takes_number_not_bool(cls.model_fields[info.field_name].annotation):
                raise ValueError(f"expected a number, got the boolean {value}")
        return value
