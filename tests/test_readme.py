"""The README as a new user reads it: its links lead somewhere, its Python example runs, and the
commands it names exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "cluster" / "README.md", ROOT / "jobs" / "README.md"]


def test_relative_links_in_the_docs_exist():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_python_example_runs(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    block = text.split("### From Python", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md (From Python)", "exec"), {})
    assert (tmp_path / "circle.png").is_file()


def test_the_commands_and_files_the_readme_names_exist():
    from raydec.cli import COMMANDS

    text = (ROOT / "README.md").read_text()
    for command in set(re.findall(r"^raydec (\w+)", text, flags=re.M)):
        assert command in COMMANDS, command
    for path in set(re.findall(r"\b((?:jobs|cluster|examples|benchmarks)/[\w./-]+\.(?:yaml|py|sh|ipynb|md))\b", text)):
        assert (ROOT / path).exists(), path
