"""``python -m raydec.commands.config_reference [--check]``: write docs/configuration.md, the
reference of every raydec config, generated from the pydantic models.

Every table row comes from ``Model.model_fields`` (annotation, default, constraints, description)
and every section text from the model's docstring, so the page cannot drift from the code: the
test ``tests/test_configuration_doc.py`` fails when the committed page differs from
``render_reference()``. ``--check`` writes nothing and exits 1 when the page is stale.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import inspect
import sys
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from raydec.runtime.config import JobConfig, ProcessorConfig
from raydec.serve.config import ServeConfig
from raydec.train.config import DraftTrainingConfig
from raydec.api import RENAMED_NAMES
from raydec.commands.local_inputs import RENAMED_FLAGS
from raydec.validation import RENAMES_REMOVED_IN

REGENERATE = "python -m raydec.commands.config_reference"
DEFAULT_OUTPUT = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

#: the configs a user writes as a whole, in the order the page presents them
TOP_LEVEL: tuple[type[BaseModel], ...] = (JobConfig, ServeConfig, ProcessorConfig, DraftTrainingConfig)

#: a warning placed above a section's table (the docstring says what the model is; this says who it is for)
_NOTES: dict[str, str] = {}

_INTRO = f"""\
# Configuration reference

<!-- Generated from raydec's pydantic models by `{REGENERATE}`; do not edit by hand. -->

Every raydec config is a pydantic model: unknown keys are errors that name the key, a boolean
given for a number is an error, and so is a NaN or infinite float. A field marked *required* has
no default; every other field may be left out. Nested configs are written as nested YAML
mappings (or dicts, or the model objects themselves, from Python).

| you write | config |
|---|---|
| a batch job's YAML file (`jobs/t2i_batch.py --config`, `jobs/caption_batch.py --config`) | [JobConfig](#jobconfig) |
| `raydec serve --config`, or the `args` of a Serve config file (`import_path: raydec.serve:app_builder`) | [ServeConfig](#serveconfig) |
| `raydec.runtime.build_processor(...)`: a text-to-image or captioning stage over your own Ray Dataset | [ProcessorConfig](#processorconfig) |
| a draft model training run's YAML file (`raydec train --config`, `jobs/train_vispec.py --config`) | [DraftTrainingConfig](#drafttrainingconfig) |

The remaining sections are the configs nested in those four; a type that links to a section is
written as a mapping of that section's fields.
"""


def documented_models() -> list[type[BaseModel]]:
    """The top-level configs, then every model nested in them, depth first in field order (a
    model's base config just before it)."""
    order: list[type[BaseModel]] = list(TOP_LEVEL)

    def visit(model: type[BaseModel]) -> None:
        for field in model.model_fields.values():
            for nested in _models_in(field.annotation):
                if nested in order:
                    continue
                for base in _config_bases(nested):
                    if base not in order:
                        order.append(base)
                        visit(base)
                order.append(nested)
                visit(nested)

    for model in TOP_LEVEL:
        visit(model)
    return order


def _config_bases(model: type[BaseModel]) -> list[type[BaseModel]]:
    """The configs a model extends (bases with fields of their own; not StrictModel itself)."""
    return [base for base in model.__bases__ if issubclass(base, BaseModel) and base.model_fields]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation names (``X``, ``list[X]``, ``X | None``, ...), in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for argument in typing.get_args(annotation):
        found += [model for model in _models_in(argument) if model not in found]
    return found


def render_reference() -> str:
    """The whole Markdown page (docs/configuration.md)."""
    models = documented_models()
    used_by: dict[type[BaseModel], list[str]] = {model: [] for model in models}
    for model in models:
        for name, field in model.model_fields.items():
            for nested in _models_in(field.annotation):
                used_by[nested].append(f"[{model.__name__}](#{model.__name__.lower()}).`{name}`")
    parts = [_INTRO, "## Top-level configs\n"]
    for model in models[: len(TOP_LEVEL)]:
        parts.append(_section(model, used_by[model]))
    parts.append("## Nested configs\n")
    for model in models[len(TOP_LEVEL):]:
        parts.append(_section(model, used_by[model]))
    parts.append(_renames(models))
    return "\n".join(parts).rstrip("\n") + "\n"


def _section(model: type[BaseModel], used_by: list[str]) -> str:
    lines = [f"### {model.__name__}", ""]
    doc = model.__dict__.get("__doc__")
    if doc:
        lines += [_markdown(inspect.cleandoc(doc)), ""]
    about = [f"Python: `{model.__module__}.{model.__name__}`."]
    bases = _config_bases(model)
    if bases:
        about.append(f"Extends {', '.join(_link(base) for base in bases)}: its fields come first below.")
    subclasses = [sub for sub in documented_models() if model in _config_bases(sub)]
    if subclasses:
        about.append(f"Extended by {', '.join(_link(sub) for sub in subclasses)}.")
    if used_by:
        about.append(f"Used by {', '.join(used_by)}.")
    lines += [" ".join(about), ""]
    if model.__name__ in _NOTES:
        lines += [f"> {_NOTES[model.__name__]}", ""]
    lines += ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        cells = [f"`{name}`", _field_type(field), _default(field), _constraints(field), _markdown(field.description or "")]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    renamed = getattr(model, "renamed_keys", None) or {}
    if renamed:
        names = ", ".join(f"`{old}` (now `{new}`)" for old, new in renamed.items())
        lines += ["", f"Keys of earlier releases, read with a warning until {RENAMES_REMOVED_IN}: {names}."]
    return "\n".join(lines) + "\n"


def _renames(models: list[type[BaseModel]]) -> str:
    """Every name of an earlier release still read, in one table, with the release that stops reading it."""
    rows = [(f"[{model.__name__}](#{model.__name__.lower()}) key", old, new)
            for model in models for old, new in (getattr(model, "renamed_keys", None) or {}).items()]
    rows += [("`raydec generate` / `caption` flag", old, new) for old, new in RENAMED_FLAGS.items()]
    rows += [("Python name", old, new) for old, new in RENAMED_NAMES.items()]
    lines = ["## Names of earlier releases", "",
             "Still read, with a warning naming the new name; each stops loading in the release shown.", "",
             "| where | old name | new name | stops loading in |", "|---|---|---|---|"]
    lines += [f"| {where} | `{old}` | `{new}` | {RENAMES_REMOVED_IN} |" for where, old, new in rows]
    return "\n".join(lines) + "\n"


def _field_type(field: FieldInfo) -> str:
    """The field's type; a string kept out of the model's repr (``repr=False``) is a secret too."""
    name = _type_name(field.annotation)
    if field.repr is False:
        name = " or ".join("secret string" if part == "string" else part for part in name.split(" or "))
    return name


def _markdown(text: str) -> str:
    """Docstring / description text as Markdown: ``x`` (reST) becomes `x`, and a `*` outside
    code is escaped so that two of them never turn into emphasis."""
    parts = text.replace("``", "`").split("`")
    return "`".join(part if index % 2 else part.replace("*", "\\*") for index, part in enumerate(parts))


def _cell(text: str) -> str:
    """A table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _link(model: type[BaseModel]) -> str:
    return f"[{model.__name__}](#{model.__name__.lower()})"


_SCALARS: dict[Any, str] = {
    str: "string", int: "integer", float: "number", bool: "boolean", Path: "path", SecretStr: "secret string",
    Any: "any", type(None): "null",
}


def _type_name(annotation: Any) -> str:
    """A YAML-minded name: ``string``, ``list of [ServedModel](#servedmodel)``, ``integer or null``, ..."""
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _link(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "string"
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(arguments[0])
    if origin is typing.Literal:
        kinds = sorted({_type_name(type(value)) for value in arguments})
        return " or ".join(kinds)
    if origin in (typing.Union, types.UnionType):
        names: list[str] = []
        for argument in sorted(arguments, key=lambda a: a is type(None)):  # null last
            name = _type_name(argument)
            if name not in names:
                names.append(name)
        return " or ".join(names)
    if origin in (list, set, frozenset, typing.Sequence):
        return f"list of {_type_name(arguments[0])}" if arguments else "list"
    if origin is tuple:
        if len(arguments) == 2 and arguments[1] is Ellipsis:
            return f"list of {_type_name(arguments[0])}"
        return "[" + ", ".join(_type_name(argument) for argument in arguments) + "]"
    if origin is dict:
        return f"mapping of {_type_name(arguments[0])} to {_type_name(arguments[1])}" if arguments else "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        if getattr(field, "default_factory_takes_validated_data", False):
            return "computed"
        return f"`{_value(field.default_factory())}`"
    if field.default is PydanticUndefined:
        return "*required*"
    return f"`{_value(field.default)}`"


def _value(value: Any) -> str:
    """A default as a user would write it: YAML scalars, ``[...]``, ``{...}``, ``Model()``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return _value(value.value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return f'"{value}"'
    if isinstance(value, SecretStr):
        return '"**********"'
    if isinstance(value, BaseModel):
        changed = {
            name: getattr(value, name) for name, field in type(value).model_fields.items()
            if field.default_factory is None and field.default is not PydanticUndefined
            and getattr(value, name) != field.default
        }
        arguments = ", ".join(f"{name}={_value(item)}" for name, item in changed.items())
        return f"{type(value).__name__}({arguments})"
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return "[" + ", ".join(_value(item) for item in items) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_value(key)}: {_value(item)}" for key, item in value.items()) + "}"
    return repr(value)


def _constraints(field: FieldInfo) -> str:
    """Ranges, lengths, patterns and choices, in the field's metadata order, then the choices."""
    is_list = _is_collection(field.annotation)
    found: list[str] = []
    for item in [*field.metadata, *_member_metadata(field.annotation)]:
        if isinstance(item, annotated_types.Ge):
            found.append(f">= {_number(item.ge)}")
        elif isinstance(item, annotated_types.Gt):
            found.append(f"> {_number(item.gt)}")
        elif isinstance(item, annotated_types.Le):
            found.append(f"<= {_number(item.le)}")
        elif isinstance(item, annotated_types.Lt):
            found.append(f"< {_number(item.lt)}")
        elif isinstance(item, annotated_types.MultipleOf):
            found.append(f"multiple of {_number(item.multiple_of)}")
        elif isinstance(item, annotated_types.MinLen):
            found.append(f"at least {item.min_length} item{'s' * (item.min_length != 1)}" if is_list
                         else "non-empty" if item.min_length == 1 else f"at least {item.min_length} characters")
        elif isinstance(item, annotated_types.MaxLen):
            found.append(f"at most {item.max_length} item{'s' * (item.max_length != 1)}" if is_list
                         else f"at most {item.max_length} characters")
        elif getattr(item, "pattern", None) is not None:
            found.append(f"pattern `{item.pattern}`")
        else:
            found.append(f"`{item!r}`")
    choices = _choices(field.annotation)
    if choices and found and _member_metadata(field.annotation):  # a bounded number or a word: "<= 8, or `"auto"`"
        found.append("or " + ", ".join(f"`{_value(c)}`" for c in choices))
    elif choices:
        found.append(("each one of " if is_list else "one of ") + ", ".join(f"`{_value(c)}`" for c in choices))
    return ", ".join(found)


def _member_metadata(annotation: Any) -> list[Any]:
    """The constraints of a union's annotated members (``Annotated[int, Field(ge=1)] | Literal["auto"]``)."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return []
    found: list[Any] = []
    for member in typing.get_args(annotation):
        if typing.get_origin(member) is typing.Annotated:
            for item in typing.get_args(member)[1:]:
                found += list(getattr(item, "metadata", [item]))
    return found


def _number(value: Any) -> str:
    """A bound; powers of two past a million read as ``2^63``."""
    if isinstance(value, int) and value > 2**20 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return repr(value)


def _is_collection(annotation: Any) -> bool:
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(_is_collection(a) for a in arguments if a is not type(None))
    return origin in (list, tuple, set, frozenset, dict, typing.Sequence)


def _choices(annotation: Any) -> list[Any]:
    """The values of the Literals (and enums) an annotation allows, in definition order."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return list(annotation)
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return list(arguments)
    if origin is dict:
        return []
    values: list[Any] = []
    for argument in arguments:
        values += [value for value in _choices(argument) if value not in values]
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 (printing a diff) when the page is stale")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the page (default: docs/configuration.md)")
    args = parser.parse_args(argv)
    text = render_reference()
    if args.check:
        current = args.output.read_text() if args.output.is_file() else ""
        if current == text:
            print(f"{args.output} is up to date")
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(keepends=True), text.splitlines(keepends=True),
            fromfile=f"{args.output} (committed)", tofile=f"{args.output} (generated)",
        ))
        print(f"{args.output} is stale: run `{REGENERATE}`", file=sys.stderr)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
