"""docs/development.md's layout of the repository follows the tree.

The layout is an indented tree in the first code block of its "## Layout" section: an entry is a
line whose name (a folder ending in ``/``, or a file) starts at an even column below 16, two spaces
deeper than the folder it is in; its description follows after two spaces or more, and a description
that goes on over more lines is indented to column 16 or more. Two checks:

- every module under raydec/ is named (``__init__.py`` files aside, and the testbed raydec/reference/,
  whose layout names its folders only);
- every path the layout names exists.

A failure lists exactly the paths to add to the layout and those to remove from it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "development.md"
PACKAGE = "raydec"
UNLISTED = ("raydec/reference/",)  # the testbed: the layout names its folders, not its modules

ENTRY = re.compile(r"^( {0,14})([\w.-][\w./-]*)(?:\s{2,}.*)?$")
NAME_COLUMN = 16  # continuation lines of a description start at this column or further


def layout_block(text: str) -> list[str]:
    """The lines of the first code block after the "## Layout" heading."""
    section = text.split("\n## Layout", 1)[1]
    return section.split("```", 2)[1].split("\n")[1:]


def layout_paths(lines: list[str]) -> list[str]:
    """The paths an indented layout names, folders ending in ``/``, in the layout's order."""
    paths: list[str] = []
    parents: list[str] = []  # the folder at each depth
    for line in lines:
        match = ENTRY.match(line)
        if not line.strip() or match is None:
            continue
        indent, name = len(match.group(1)), match.group(2)
        if indent % 2 or not (name.endswith("/") or "." in name):
            continue  # a description's continuation
        depth = indent // 2
        if depth > len(parents):
            raise ValueError(f"layout line {line!r} is indented deeper than the folder above it")
        parents = parents[:depth]
        path = "".join(parents) + name
        paths.append(path)
        if name.endswith("/"):
            parents.append(name)
    return paths


def package_modules() -> set[str]:
    """Every module file under raydec/ the layout must name."""
    return {
        path.relative_to(ROOT).as_posix() for path in (ROOT / PACKAGE).rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
        and not path.relative_to(ROOT).as_posix().startswith(UNLISTED)
    }


def test_the_layout_parser_reads_an_indented_tree():
    snippet = [
        "pkg/",
        "  a.py            the first module, described",
        "                  over two lines (a.py is not named again here)",
        "  sub/            a folder",
        "    b.py",
        "    deep/         ",
        "      c.py        in deep/",
        "  d.py            back in pkg/",
        "docs/x.md         a file at the top",
    ]
    assert layout_paths(snippet) == ["pkg/", "pkg/a.py", "pkg/sub/", "pkg/sub/b.py", "pkg/sub/deep/", "pkg/sub/deep/c.py",
                                     "pkg/d.py", "docs/x.md"]


def test_the_development_layout_names_every_module_and_only_what_exists():
    named = layout_paths(layout_block(DOC.read_text()))
    assert "raydec/" in named and "raydec/api/tuner.py" in named  # the parser found the tree
    add = sorted(package_modules() - set(named))
    remove = [path for path in named if not (ROOT / path.rstrip("/")).exists()]
    problems = []
    if add:
        problems.append("add to the layout (modules it does not name):\n    " + "\n    ".join(add))
    if remove:
        problems.append("remove from the layout (paths that do not exist):\n    " + "\n    ".join(remove))
    assert not problems, "docs/development.md, ## Layout, is out of date:\n  " + "\n  ".join(problems)
