"""The commands the docs tell a user to run exist.

Every ``raydec <command>`` (and ``raydec bench <bench>``) that README.md or a page of docs/ names in
a code block or in inline code answers ``--help`` with exit status 0, and every ``benchmarks/<script>``
they name is a file of the repository (a Python script answers ``--help``, a shell script parses).
A failure names the page and line of each command that does not exist.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"(`+)(.+?)\1", re.S)
# `raydec <command> [<bench>]`, after the start of the code, a space, a path (.venv/bin/raydec) or an
# assignment (RAY_ADDRESS=... raydec run); `raydec.x` and `raydec/x` are module and file names
RAYDEC = re.compile(r"(?:^|(?<=[\s/=;&|(\"']))raydec[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w|/\\-]*))?")
SCRIPT = re.compile(r"(?<![\w/.-])benchmarks/([\w.-]+\.(?:py|sh))\b")


def code_spans(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block's lines and every inline code span (which may
    run over a line break) of a markdown text."""
    spans: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []  # (first line number, lines) of the text between fences

    def flush_prose() -> None:
        if not prose:
            return
        first, block = prose[0][0], "\n".join(line for _, line in prose)
        for match in INLINE.finditer(block):
            spans.append((first + block.count("\n", 0, match.start()), " ".join(match.group(2).split())))
        prose.clear()

    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        marker = FENCE.match(line)
        if fence is None and marker:
            flush_prose()
            fence = marker.group(1)
        elif fence is not None and marker and marker.group(1) == fence:
            fence = None
        elif fence is not None:
            spans.append((number, line))
        else:
            prose.append((number, line))
    flush_prose()
    return spans


def named_commands(text: str) -> tuple[dict[tuple[str, ...], list[int]], dict[str, list[int]]]:
    """The raydec commands (``("bench", "t2i")``, ``("run",)``) and the benchmarks/ scripts a markdown
    text names in its code, each with the lines that name it."""
    commands: dict[tuple[str, ...], list[int]] = {}
    scripts: dict[str, list[int]] = {}
    for number, code in code_spans(text):
        for match in RAYDEC.finditer(code):
            command, rest = match.group(1), match.group(2)
            names = [(command,)]
            if command == "bench" and rest:
                names = [("bench", name) for name in re.split(r"[|/\\]+", rest) if re.fullmatch(r"[a-z]\w*", name)] or names
            for name in names:
                commands.setdefault(name, []).append(number)
        for match in SCRIPT.finditer(code):
            scripts.setdefault(match.group(1), []).append(number)
    return commands, scripts


def answers_help(argv: tuple[str, ...]) -> bool:
    """Whether ``raydec ARGV --help`` exits 0 (run in this process: ``raydec.cli.main``)."""
    from raydec.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main([*argv, "--help"])
    except SystemExit as exit_:
        status = exit_.code
    return status in (0, None)


def collect() -> tuple[dict[tuple[str, ...], list[str]], dict[str, list[str]]]:
    """Every command and script the docs name, with ``page:line`` of each mention."""
    commands: dict[tuple[str, ...], list[str]] = {}
    scripts: dict[str, list[str]] = {}
    for doc in DOCS:
        found_commands, found_scripts = named_commands(doc.read_text())
        where = doc.relative_to(ROOT)
        for found, into in ((found_commands, commands), (found_scripts, scripts)):
            for name, lines in found.items():
                into.setdefault(name, []).extend(f"{where}:{line}" for line in lines)
    return commands, scripts


def test_the_extractor_finds_commands_in_code_only():
    text = "\n".join([
        "# Title",  # 1
        "raydec nothing here: prose is not code, and neither is raydec.tuning or `raydec.api`",  # 2
        "```bash",  # 3
        ".venv/bin/raydec bench t2i --prompts 2      # a comment",  # 4
        "RAY_ADDRESS=http://head:8265 raydec run job.yaml",  # 5
        "python benchmarks/host_work.py --threads 2 && benchmarks/gpu_check.sh OUT",  # 6
        "```",  # 7
        "Then `raydec generate \"a circle\" --out pngs/`, or `raydec <command> --help`, and a long",  # 8
        "`raydec bench",  # 9
        "caption --images 2`; `raydec bench engine\\|step` in a table; `raydec/cli.py` is a file.",  # 10
        "~~~",  # 11
        "raydec serve --config x.yaml",  # 12
        "~~~",  # 13
        "`other/benchmarks/x.py` is another folder's.",  # 14
    ])
    commands, scripts = named_commands(text)
    assert commands == {
        ("bench", "t2i"): [4], ("run",): [5], ("generate",): [8], ("bench", "caption"): [9],
        ("bench", "engine"): [10], ("bench", "step"): [10], ("serve",): [12],
    }
    assert scripts == {"host_work.py": [6], "gpu_check.sh": [6]}
    assert answers_help(("run",)) and answers_help(("bench", "t2i"))
    assert not answers_help(("nosuch",)) and not answers_help(("bench", "nosuch"))


def test_every_raydec_command_the_docs_name_exists():
    commands, _ = collect()
    assert ("bench", "t2i") in commands and ("run",) in commands  # the scan finds what the README shows
    missing = [f"raydec {' '.join(argv)}  (named at {', '.join(places)})" for argv, places in sorted(commands.items())
               if not answers_help(argv)]
    assert not missing, "commands the docs name that `raydec ... --help` does not know:\n" + "\n".join(missing)


def test_every_benchmarks_script_the_docs_name_exists():
    _, scripts = collect()
    problems = []
    for name, places in sorted(scripts.items()):
        path = ROOT / "benchmarks" / name
        if not path.is_file():
            problems.append(f"benchmarks/{name} does not exist (named at {', '.join(places)})")
            continue
        command = [sys.executable, str(path), "--help"] if name.endswith(".py") else ["bash", "-n", str(path)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            problems.append(f"`{' '.join(command[:2] if name.endswith('.py') else command)}` exits {done.returncode} "
                            f"(named at {', '.join(places)}): {done.stderr.strip()[-300:]}")
    assert not problems, "benchmarks/ scripts the docs name:\n" + "\n".join(problems)
