"""The `raydec` command."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="raydec", description="Lossless speculative decoding on Ray.")
    parser.add_argument("command", choices=["bench", "demo", "serve"],
                        help="bench: measurements; demo: the quickstart job; serve: the OpenAI-compatible app on Ray Serve")
    known, rest = parser.parse_known_args(argv[:1])
    if known.command == "bench":
        from raydec.bench.cli import main as bench_main

        return bench_main(argv[1:])
    if known.command == "serve":
        from raydec.commands.serve import main as serve_main

        return serve_main(argv[1:])
    from raydec.demo import main as demo_main

    return demo_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
