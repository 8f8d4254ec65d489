"""The testbed's layout rules: raydec/reference is split into small modules (at most 300 lines,
functions at most 80), one subpackage per part (shapes, judge, janus, llava, assistant), and a
module shares only public names with its siblings. Read with ``ast``; nothing is imported but
for the weights-folder check."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[2] / "raydec" / "reference"
MODULES = sorted(REFERENCE.rglob("*.py"))
MAX_LINES = 300
MAX_FUNCTION_LINES = 80


def _name(path: Path) -> str:
    return str(path.relative_to(REFERENCE.parents[1]))


def _imported_module(node: ast.ImportFrom, path: Path) -> str:
    """The dotted module an ``ImportFrom`` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = list(path.relative_to(REFERENCE.parents[1]).with_suffix("").parts)
    package = package[: len(package) - node.level]  # a module's own package is level 1
    return ".".join(package + ([node.module] if node.module else []))


def test_the_testbed_has_modules():
    assert len(MODULES) > 20 and (REFERENCE / "shapes" / "__init__.py") in MODULES


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_is_over_300_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{_name(path)} has {lines} lines (at most {MAX_LINES}): split it"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_function_is_over_80_lines(path):
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_imports_a_private_name_of_the_testbed(path):
    """``from raydec.reference.x import _y`` (or ``from . import _y``, ``import raydec.reference._x``)
    reaches into a sibling's internals: make the name public or move it where it is used."""
    private = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = _imported_module(node, path)
            if module == "raydec.reference" or module.startswith("raydec.reference."):
                private += [f"line {node.lineno}: {module} {alias.name}" for alias in node.names
                            if alias.name.startswith("_")]
                if any(part.startswith("_") for part in module.split(".")):
                    private.append(f"line {node.lineno}: {module}")
        elif isinstance(node, ast.Import):
            private += [f"line {node.lineno}: {alias.name}" for alias in node.names
                        if alias.name.startswith("raydec.reference.")
                        and any(part.startswith("_") for part in alias.name.split("."))]
    assert not private, f"{_name(path)} imports private names of the testbed: {private}"


def test_the_layout_check_sees_private_imports():
    """The check above reads absolute and relative imports alike."""
    source = "from raydec.reference.shapes.scene import _pick\nfrom .text import _count_words\nfrom . import scene\n"
    tree = ast.parse(source)
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    path = REFERENCE / "shapes" / "dense.py"
    assert [_imported_module(n, path) for n in nodes] == [
        "raydec.reference.shapes.scene", "raydec.reference.shapes.text", "raydec.reference.shapes"]
    assert [a.name.startswith("_") for n in nodes for a in n.names] == [True, True, False]


def test_default_weights_folders_are_the_shipped_ones():
    """Modules one folder below raydec/reference still name raydec/reference/weights."""
    from raydec.reference.assistant.settings import DEFAULT_ASSISTANT_DIR
    from raydec.reference.janus.settings import DEFAULT_OUT_DIR
    from raydec.reference.llava.draft_command import DRAFTS_DIR
    from raydec.reference.llava.model import DEFAULT_WEIGHTS_DIR
    from raydec.reference.load import WEIGHTS_DIR

    weights = (REFERENCE / "weights").resolve()
    assert WEIGHTS_DIR.resolve() == weights
    assert DEFAULT_OUT_DIR.resolve() == weights / "t2i"
    assert DEFAULT_WEIGHTS_DIR.resolve() == weights / "vlm"
    assert DRAFTS_DIR.resolve() == weights / "vlm-drafts"
    assert DEFAULT_ASSISTANT_DIR.resolve() == weights / "vlm-drafts" / "assistant"
    assert all((folder / "config.json").is_file() for folder in (DEFAULT_OUT_DIR, DEFAULT_WEIGHTS_DIR, DEFAULT_ASSISTANT_DIR))
