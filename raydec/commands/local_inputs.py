"""What ``raydec generate`` and ``raydec caption`` read: prompts or images from arguments, a
text file or a Parquet file; and the decode config from YAML and flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional, get_args

import yaml

from raydec.config import DRAFT_METHODS, JACOBI_METHODS, DecodeConfig

#: the values of DecodeConfig.coupling (how a sampled row's tokens follow from its seed)
COUPLINGS: tuple[str, ...] = get_args(DecodeConfig.model_fields["coupling"].annotation)

#: flags of earlier releases, still read until raydec.validation.RENAMES_REMOVED_IN (old -> new)
RENAMED_FLAGS = {"--draft": "--shape"}


def add_decode_flags(parser: argparse.ArgumentParser, methods: tuple[str, ...], default_method: str) -> None:
    parser.add_argument("--model", default="reference", help="'reference', a local checkpoint folder, a hub id "
                        "(org/name[@revision], from the Hugging Face cache or downloaded once) or s3://bucket/prefix (downloaded once "
                        "into $RAYDEC_CACHE_DIR/models; S3 access from the AWS_* environment) (default: reference)")
    parser.add_argument("--method", choices=methods, default=None, help=f"decoding method (default: {default_method})")
    parser.add_argument("--decode-config", type=Path, default=None,
                        help="a YAML file of DecodeConfig fields (docs/configuration.md); flags override it")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (0: greedy); default: the checkpoint's")
    parser.add_argument("--top-k", type=int, default=None, help="top-k (0 disables); default: the checkpoint's")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus mass; default: the checkpoint's")
    parser.add_argument("--coupling", choices=COUPLINGS, default=None,
                        help="how a sampled row's tokens follow from its seed (both sample the target's law): rejection "
                        "(rejection sampling: a seed's tokens depend on the method and draft shape) or gumbel (Gumbel-max "
                        "noise fixed per position: a seed gives the same tokens whatever the method, draft shape or batch); "
                        "default: --decode-config's, else gumbel")
    parser.add_argument("--shape", "--draft", dest="shape", choices=["default", "auto"], default="default",
                        help="the draft shape (sjd*: the Jacobi window / tree; vispec / eagle: the draft tree): default (the "
                        "default) is the method's default shape, or the one --decode-config names, as in a job or Serve; "
                        "auto tunes it for --batch-size on this device on the first rows, plain AR among the candidates, "
                        "and caches the choice. (--draft: its name in earlier releases, read until 0.2.0)")
    parser.add_argument("--compile", choices=["auto", "on", "off"], default=None,
                        help="capture each decode step's tensor work as compiled graphs (auto: on for CUDA, off on a CPU; "
                        "the same tokens either way; see docs/engine.md)")
    parser.add_argument("--seed", type=int, default=0, help="row i gets seed SEED + i (default 0)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows decoded together (default 8)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "float64"], default="float32", help="weights dtype")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cpu)")


def decode_config(args: argparse.Namespace, default_method: str, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """DecodeConfig fields: the YAML file's, then the flags (only those given)."""
    values: dict[str, Any] = {}
    if args.decode_config is not None:
        loaded = yaml.safe_load(args.decode_config.read_text()) or {}
        if not isinstance(loaded, dict):
            raise SystemExit(f"--decode-config {args.decode_config}: expected a mapping of DecodeConfig fields")
        values.update(loaded)
    values["method"] = args.method or values.get("method") or default_method
    sampling = dict(values.get("sampling") or {})
    for name in ("temperature", "top_k", "top_p"):
        if getattr(args, name) is not None:
            sampling[name] = getattr(args, name)
    if sampling:
        values["sampling"] = sampling
    for name in ("compile", "coupling"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    values.update(extra or {})
    shape_field = "jacobi" if values["method"] in JACOBI_METHODS else "draft_tree" if values["method"] in DRAFT_METHODS else None
    if args.shape == "auto" and shape_field is not None:
        values.setdefault(shape_field, "auto")  # a shape in --decode-config stays
    return values


def read_texts(items: list[str], text_file: Optional[Path], parquet: Optional[Path], column: str) -> tuple[list[str], list[str]]:
    """(ids, prompts) from arguments, a text file (one per line, blank lines skipped) or a Parquet column."""
    sources = sum(1 for s in (items, text_file, parquet) if s)
    if sources != 1:
        raise SystemExit("give prompts as arguments, or --prompts-file, or --parquet (exactly one)")
    if items:
        return [f"{i:05d}" for i in range(len(items))], list(items)
    if text_file is not None:
        lines = [line.strip() for line in text_file.read_text().splitlines() if line.strip()]
        return [f"{i:05d}" for i in range(len(lines))], lines
    return _parquet_column(parquet, column, str)


def _parquet_column(path: Path, column: str, kind: type) -> tuple[list[str], list[Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if column not in table.column_names:
        raise SystemExit(f"--parquet {path}: no column {column!r} (columns: {table.column_names})")
    ids = [str(i) for i in table["id"].to_pylist()] if "id" in table.column_names else [f"{i:05d}" for i in range(table.num_rows)]
    return ids, table[column].to_pylist()


def read_images(items: list[str], parquet: Optional[Path], column: str) -> tuple[list[str], list[Any]]:
    """(ids, images as paths or bytes) from file arguments or a Parquet column of bytes or paths."""
    if bool(items) == bool(parquet):
        raise SystemExit("give image files as arguments, or --parquet (exactly one)")
    if items:
        return [Path(item).stem for item in items], list(items)
    return _parquet_column(parquet, column, bytes)
