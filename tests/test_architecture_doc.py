"""docs/architecture.md names modules and objects; each must exist, so the page follows the code."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def resolves(dotted: str) -> bool:
    """``raydec.a.b.C.d``: the longest importable prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


def test_every_module_and_file_the_architecture_page_names_exists():
    text = DOC.read_text()
    names = set(re.findall(r"\braydec(?:\.\w+)+", text))
    files = set(re.findall(r"\b((?:raydec|jobs)/[\w/]+\.py)\b", text))
    assert len(names) > 30 and files  # the page walks the code, so it names much of it
    missing = sorted(name for name in names if not resolves(name))
    assert not missing, f"docs/architecture.md names what the code does not have: {missing}"
    assert not [f for f in sorted(files) if not (ROOT / f).is_file()]
