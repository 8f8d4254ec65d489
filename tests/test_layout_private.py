"""No raydec module reaches into another's private names.

A leading underscore says "this module's own business": a name imported across modules, or a
``_method`` called on an object other than ``self`` / ``cls`` / ``super()``, ties one module to
another's internals, and such a seam is a hook that does not say so. The scan walks every module
under raydec/ (the testbed and the Serve layer are excluded for now) and reports:

- ``from raydec.x import _name`` and ``import raydec.x._y`` (relative imports likewise);
- ``something._name(...)`` where ``something`` is not ``self``, ``cls`` or ``super()``.

Dunder names (``__init__``, ``__exit__``) are public protocol, not private. ALLOWED lists the
calls into a third-party library's private API (or the standard library's underscore-named public
functions) that have no public equivalent, each with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "raydec"

ALLOWED = {
    ("raydec/models/generation_config.py", "GenerationConfig._get_default_generation_params"):
        "transformers: the values `generate` gives unset generation-config fields; GenerationConfig's own "
        "docstring names this method as their source, and no public call returns them",
    ("raydec/serve/engine_worker.py", "os._exit"):
        "the standard library's documented way to end a process at once from any thread, without waiting for "
        "interpreter shutdown: the engine process exits so when its replica is gone or its decode loop died",
}
"""(file, called expression) -> why it may call a third-party private method."""


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def scanned_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def violations(source: str, relative: str) -> list[str]:
    """Each private import or foreign private call in ``source`` (the file ``relative``), as 'file:line: what'."""
    found = []
    for node in ast.walk(ast.parse(source, filename=relative)):
        where = f"{relative}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "raydec"):
            module = "." * node.level + (node.module or "")
            if any(private(part) for part in (node.module or "").split(".")):
                found.append(f"{where}: from {module} import (a private module)")
            found += [f"{where}: from {module} import {alias.name}" for alias in node.names if private(alias.name)]
        elif isinstance(node, ast.Import):
            found += [f"{where}: import {alias.name}" for alias in node.names
                      if alias.name.split(".")[0] == "raydec" and any(private(part) for part in alias.name.split("."))]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and private(node.func.attr):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            called = ast.unparse(node.func)
            if (relative, called) not in ALLOWED:
                found.append(f"{where}: {called}(...)")
    return found


def test_the_scan_sees_every_kind_of_violation():
    """The scan has teeth: each pattern it forbids is reported, and what it allows is not."""
    text = (
        "from raydec.io.writers import _hidden, shown\n"
        "from ._sibling import name\n"
        "import raydec._inner\n"
        "def f(session, self=None):\n"
        "    session._retire()\n"
        "    self._own()\n"
        "    super()._base()\n"
        "    session.__exit__(None, None, None)\n"
        "    session.public()\n"
    )
    found = violations(text, "raydec/sample.py")
    kinds = [line.split(": ", 1)[1] for line in found]
    assert kinds == [
        "from raydec.io.writers import _hidden",
        "from ._sibling import (a private module)",
        "import raydec._inner",
        "session._retire(...)",
    ]


def test_no_raydec_module_imports_or_calls_another_modules_private_names():
    files = scanned_files()
    assert len(files) > 50
    found = [line for path in files for line in violations(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not found, "private names used across modules (make them public, or move them where they belong):\n" + "\n".join(found)


def test_the_allowlist_holds_only_what_is_still_there():
    for (relative, called) in ALLOWED:
        assert f"{called}(" in (ROOT / relative).read_text(), f"{relative} no longer calls {called}: drop it from ALLOWED"


def test_no_raydec_module_imports_the_tests():
    """Test helpers (the random-tree proposer, toy targets, broken verifiers) stay in tests/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names if name.split(".")[0] == "tests"]
    assert not found, "\n".join(found)
