"""The `raydec` command: `raydec <command> --help` documents each.

A user's error (a missing file or folder, a checkpoint raydec cannot load, a bad size or config
value) ends a command with one message naming what was wrong and exit status 1, not a traceback;
``RAYDEC_TRACEBACK=1`` shows the traceback too.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

# command -> (module with main(argv), one line)
COMMANDS = {
    "generate": ("raydec.commands.generate", "text to PNG files, in this process"),
    "caption": ("raydec.commands.caption", "images to captions, in this process"),
    "check": ("raydec.commands.check", "that a method decodes plain AR's tokens on your model, rows, dtype and device"),
    "run": ("raydec.commands.run", "a batch job from its YAML config, on a Ray cluster (RAY_ADDRESS) or a local one"),
    "serve": ("raydec.commands.serve", "the OpenAI-compatible app on Ray Serve"),
    "train": ("raydec.commands.train", "train ViSpec / EAGLE draft models for a target"),
    "bench": ("raydec.bench.cli", "side-by-side measurements (engine, step, t2i, caption, pipeline, serve)"),
    "demo": ("raydec.demo", "the quickstart: a local Ray cluster, the reference models, a batch into out/"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name.ljust(width)}  {line}" for name, (_, line) in COMMANDS.items()]
    return "usage: raydec <command> [options]\n\nLossless speculative decoding on Ray.\n\ncommands:\n" + "\n".join(lines) + \
        "\n\n`raydec <command> --help` lists a command's options."


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"raydec: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if command not in ("caption",):  # caption prints only its answers
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(COMMANDS[command][0])
    try:
        return int(module.main(rest) or 0)
    except (ValueError, OSError) as error:  # bad input: a value, a file, a folder, a checkpoint, a connection
        if os.environ.get("RAYDEC_TRACEBACK"):
            raise
        print(f"raydec {command}: {user_message(error)}", file=sys.stderr)
        return 1


def user_message(error: BaseException) -> str:
    """What went wrong, without the traceback: the error's own message (a config's bad keys keep
    their lines), with the exception's name where the message alone would not say what it is."""
    from pydantic import ValidationError

    from raydec.validation import validation_problems  # lazy: keeps raydec --help light

    if isinstance(error, ValidationError):
        return f"{error.title}: " + "; ".join(validation_problems(error))
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error).strip() or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
