"""`raydec bench ...`: side-by-side measurements, printed as a table and written as JSON.

Speed figures are ratios against a baseline measured in the same run, methods interleaved
prompt by prompt, so machine noise hits every method alike.
"""

from __future__ import annotations

import argparse

from raydec.bench.caption import add_caption_parser
from raydec.bench.common import run_bench
from raydec.bench.engine import add_engine_parser
from raydec.bench.pipeline import add_pipeline_parser
from raydec.bench.serve import add_serve_parser
from raydec.bench.step import add_step_parser
from raydec.bench.t2i import add_t2i_parser
from raydec.bench.throughput import add_throughput_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raydec bench", description=__doc__)
    subparsers = parser.add_subparsers(dest="which", required=True)
    for add_parser in (add_engine_parser, add_step_parser, add_t2i_parser, add_caption_parser, add_pipeline_parser, add_serve_parser,
                       add_throughput_parser):
        add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_bench(build_parser().parse_args(list(argv or [])))
