"""docs/configuration.md is generated from the config models; it must match them, cover every
field and have a description for each."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from raydec.commands.config_reference import REGENERATE, documented_models, render_reference
from raydec.validation import StrictModel

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"

#: modules whose configs users write; every StrictModel defined in one must be on the page
CONFIG_MODULES = (
    "raydec.config", "raydec.io.config", "raydec.runtime.config", "raydec.serve.config", "raydec.serve.media",
    "raydec.train.config",
)
#: the configs the page must have, whatever the generator's traversal finds
EXPECTED = {
    "DecodeConfig", "SamplingConfig", "JacobiDraftConfig", "DraftTreeConfig",
    "S3Config", "RowFormat", "InputConfig", "OutputConfig",
    "JobConfig", "PoolConfig", "ProcessorConfig",
    "ServeConfig", "ServedModel", "LimitsConfig", "MediaConfig",
    "DraftTrainingConfig", "DataGenConfig", "DraftTrainConfig", "LossConfig", "EvalConfig",
}


def config_models() -> list[type[StrictModel]]:
    found = []
    for name in CONFIG_MODULES:
        module = importlib.import_module(name)
        found += [value for value in vars(module).values()
                  if inspect.isclass(value) and issubclass(value, StrictModel) and value is not StrictModel
                  and value.__module__ == name]
    return found


def sections(text: str) -> dict[str, str]:
    """Each ``### Name`` section's text, by name."""
    return {chunk.split("\n", 1)[0].strip(): chunk for chunk in text.split("\n### ")[1:]}


def test_the_committed_page_is_the_generated_one():
    assert DOC.is_file(), f"{DOC.relative_to(ROOT)} is missing: run `{REGENERATE}`"
    assert DOC.read_text() == render_reference(), (
        f"{DOC.relative_to(ROOT)} is stale (a config changed): run `{REGENERATE}` and commit the result"
    )


def test_every_config_model_is_documented():
    documented = {model.__name__ for model in documented_models()}
    missing = sorted(EXPECTED - documented)
    assert not missing, f"the generator leaves out {missing}"
    unreached = sorted(model.__name__ for model in config_models() if model not in documented_models())
    assert not unreached, (
        f"configs not reachable from the top-level ones, so not on the page: {unreached} "
        "(nest them in a documented config, or add them to TOP_LEVEL in raydec/commands/config_reference.py)"
    )


def test_every_field_of_every_config_is_on_the_page():
    pages = sections(DOC.read_text())
    missing = []
    for model in documented_models():
        section = pages.get(model.__name__)
        if section is None:
            missing.append(model.__name__)
            continue
        missing += [f"{model.__name__}.{name}" for name in model.model_fields if f"\n| `{name}` |" not in section]
    assert not missing, f"docs/configuration.md lacks {missing}: run `{REGENERATE}`"


def test_every_field_has_a_description():
    undescribed = [
        f"{model.__name__}.{name}"
        for model in documented_models()
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not undescribed, (
        f"fields without description= (the configuration reference shows an empty cell): {undescribed}"
    )


def test_the_page_is_deterministic_and_links_resolve():
    text = render_reference()
    assert text == render_reference()
    assert " at 0x" not in text and "object at" not in text  # no reprs with memory addresses
    names = set(sections(text))
    links = {part.split(")", 1)[0] for part in text.split("](#")[1:]}
    assert not [link for link in sorted(links) if link not in {name.lower() for name in names}]
