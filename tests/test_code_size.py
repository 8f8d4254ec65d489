"""Size rules for the package: every module under raydec/ is at most 450 lines and every function
(``def`` to the end of its body) at most 80, so each module keeps to one job and each function fits
on a screen. The testbed (raydec/reference) has its own, stricter check in
tests/testbed/test_layout.py. Read with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "raydec"
TESTBED = PACKAGE / "reference"
MODULES = sorted(path for path in PACKAGE.rglob("*.py") if TESTBED not in path.parents)
MAX_LINES = 450
MAX_FUNCTION_LINES = 80


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'name (N lines)' for each function or method in ``source`` longer than ``limit`` lines,
    counted from its ``def`` line to the last line of its body (decorators not included)."""
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def test_the_package_has_modules():
    assert len(MODULES) > 50 and PACKAGE / "speculative" / "engine.py" in MODULES
    assert not any(TESTBED in path.parents for path in MODULES)


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_is_over_450_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{_name(path)} has {lines} lines (at most {MAX_LINES}): split it"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_function_is_over_80_lines(path):
    long = long_functions(path.read_text())
    assert not long, f"{_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def _function_source(lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines: its ``def``, then ``lines - 1`` statements."""
    body = [f"{indent}    x{i} = {i}" for i in range(lines - 1)]
    return "\n".join([f"{indent}def f():", *body]) + "\n"


def test_the_function_check_flags_81_lines_and_passes_80():
    """The check has teeth: an 81-line function (or method) is named, an 80-line one is not."""
    assert long_functions(_function_source(81)) == ["f (81 lines)"]
    assert long_functions("class C:\n" + _function_source(81, indent="    ")) == ["f (81 lines)"]
    assert long_functions(_function_source(80)) == []
