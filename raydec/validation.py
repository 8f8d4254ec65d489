"""A pydantic base for every raydec config: unknown keys are errors, and so are booleans
given for numbers.

Pydantic's lax mode reads ``True`` as ``1`` for an ``int`` field, so ``window: true`` in a YAML
job would quietly become a one-token window. Leaf module: imports nothing of raydec, so every
layer may use it.
"""

from __future__ import annotations

import types
import typing
import warnings
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator


#: the release that stops reading the names of earlier releases (``renamed_keys``, ``--draft``)
RENAMES_REMOVED_IN = "0.2.0"


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


_Config = typing.TypeVar("_Config", bound="StrictModel")


def validation_problems(exc: ValidationError) -> list[str]:
    """One line per problem: dotted field path, message and (short) offending value."""
    lines = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:  # a check across fields: its message names the fields itself
            lines.append(message)
            continue
        where = ".".join(str(part) for part in error["loc"])
        value = repr(error.get("input"))
        value = value if len(value) <= 60 else value[:57] + "..."
        lines.append(f"{where}: {message} (got {value})")
    return lines


def config_error_line(config: str | Path, exc: Exception) -> str:
    """A job script's one-line refusal: the error, prefixed with its config file unless it names it."""
    message = str(exc)
    return message if str(config) in message else f"{config}: {message}"


class StrictModel(BaseModel):
    """Base for raydec configs: unknown keys are errors, values are validated on assignment,
    a boolean given for a number and a NaN or infinite float are errors naming the field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)  # NaN: "a finite number"

    #: what ``from_yaml`` raises (a ValueError subclass), so each layer keeps its own error type
    config_error: typing.ClassVar[type[ValueError]] = ValueError

    #: keys of an earlier release (old name -> field): still read until RENAMES_REMOVED_IN, with a
    #: FutureWarning naming the new key (docs/configuration.md lists them all)
    renamed_keys: typing.ClassVar[dict[str, str]] = {}

    @classmethod
    def from_yaml(cls: type[_Config], path: str | Path) -> _Config:
        """Load and validate a YAML file; the error names the file and, per line, each bad key."""
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise cls.config_error(f"config: cannot read {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise cls.config_error(f"config: {path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise cls.config_error(f"config: {path} must hold a mapping of keys, not {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "\n".join(f"  {line}" for line in validation_problems(exc))
            raise cls.config_error(f"config: {path} is invalid:\n{problems}") from None

    @model_validator(mode="before")
    @classmethod
    def _read_renamed_keys(cls, data: object) -> object:
        if not cls.renamed_keys or not isinstance(data, dict) or not any(old in data for old in cls.renamed_keys):
            return data
        data = dict(data)
        for old, new in cls.renamed_keys.items():
            if old not in data:
                continue
            if new in data:
                raise ValueError(f"{old} and {new}: give only {new} ({old} is its name in earlier releases)")
            warnings.warn(f"{cls.__name__}: the key {old!r} is now {new!r}; {old!r} stops loading in raydec {RENAMES_REMOVED_IN}",
                          FutureWarning, stacklevel=2)
            data[new] = data.pop(old)
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, bool) and info.field_name is not None:
            if _takes_number_not_bool(cls.model_fields[info.field_name].annotation):
                raise ValueError(f"expected a number, got the boolean {value}")
        return value


def file_in_the_way(path: str | Path) -> Path | None:
    """The file that stands where ``path`` needs a folder: the first of ``path`` and its parents
    that exists, when it is not a folder; None when nothing blocks creating ``path`` as a folder."""
    path = Path(path)
    for place in (path, *path.parents):
        if place.exists():
            return None if place.is_dir() else place
    return None


def check_folder(path: str | Path, field: str) -> None:
    """Fail now, naming ``field``, when ``path`` cannot become a folder (a file stands in the way),
    rather than after a long run that would write there."""
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise NotADirectoryError(f"{field}: {str(blocker)!r} is a file, not a folder")


def text_problem(value: str) -> str | None:
    """Why ``value`` is not text a tokenizer can read, or None: a lone surrogate (U+D800-U+DFFF,
    which JSON's ``\\ud800`` escapes and Python strings can hold) is no Unicode character and
    has no UTF-8 encoding."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"holds a lone surrogate U+{ord(value[error.start]):04X} at character {error.start}, which is not valid Unicode text"
    return None
