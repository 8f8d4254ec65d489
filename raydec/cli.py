"""The `raydec` command: `raydec <command> --help` documents each."""

from __future__ import annotations

import importlib
import logging
import sys

# command -> (module with main(argv), one line)
COMMANDS = {
    "generate": ("raydec.commands.generate", "text to PNG files, in this process"),
    "caption": ("raydec.commands.caption", "images to captions, in this process"),
    "run": ("raydec.commands.run", "a batch job from its YAML config, on a Ray cluster (RAY_ADDRESS) or a local one"),
    "serve": ("raydec.commands.serve", "the OpenAI-compatible app on Ray Serve"),
    "train": ("raydec.commands.train", "train ViSpec / EAGLE drafts for a target"),
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
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
