"""Layers only import downward: the decoding core is a closed layer.

Every ``import`` and ``from ... import`` in ``raydec/speculative`` (those under
``TYPE_CHECKING`` and inside functions included) is read from the source and checked against
the layers above the core.
"""

from __future__ import annotations

import ast
from pathlib import Path

import raydec

PACKAGE = Path(raydec.__file__).parent
CORE = PACKAGE / "speculative"
# what the core may not import: the layers above it, the benches, the testbed
FORBIDDEN = (
    "raydec.models", "raydec.runtime", "raydec.api", "raydec.serve", "raydec.train", "raydec.io",
    "raydec.reference", "raydec.demo", "raydec.cli", "raydec.bench",
)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in one file, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def layer_violations(root: Path, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for line, module in imported_modules(path):
            if any(module == name or module.startswith(name + ".") or module.startswith(name + "_") for name in forbidden):
                out.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    return out


def test_the_decoding_core_imports_no_layer_above_it():
    assert CORE.is_dir()
    assert layer_violations(CORE, FORBIDDEN) == []


def test_the_check_sees_a_forbidden_import(tmp_path, monkeypatch):
    """The check has teeth: a core module that imports the models layer (even lazily) is named."""
    fake = tmp_path / "raydec" / "speculative"
    fake.mkdir(parents=True)
    (fake / "engine.py").write_text("def f():\n    from raydec.models.base import decoding_attention\n")
    (fake / "ok.py").write_text("from raydec.speculative.tree import DraftTree\nfrom . import tree\n")
    import sys

    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "raydec")
    assert layer_violations(fake, FORBIDDEN) == ["raydec/speculative/engine.py:2 imports raydec.models.base",
                                                 "raydec/speculative/engine.py:2 imports raydec.models.base.decoding_attention"]
