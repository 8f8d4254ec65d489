"""What every bench shares: argument types, the table, the JSON, the device option and the
accumulators. A leaf: it imports no bench."""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from raydec.models.base import CheckpointError
from raydec.validation import file_in_the_way

logger = logging.getLogger(__name__)


@dataclass
class MethodTimes:
    """Per-method accumulators over the prompts of one benchmark run."""

    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    forwards: list[int] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds)

    @property
    def tokens_per_forward(self) -> float:
        return sum(self.tokens) / max(1, sum(self.forwards))


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A plain fixed-width table on stdout."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(f"\n{title}\n{line}\n{'-' * len(line)}")
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


def count_arg(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (argparse names the option in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


positive_int = count_arg(1)
non_negative_int = count_arg(0)


def _int_list(text: str, least: int) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < least:
        raise argparse.ArgumentTypeError(f"expected integers >= {least}, got {text!r}")
    return values


def positive_int_list(text: str) -> list[int]:
    """An argparse ``type``: comma-separated integers >= 1 (batch sizes, windows, vocabularies)."""
    return _int_list(text, 1)


def non_negative_int_list(text: str) -> list[int]:
    """An argparse ``type``: comma-separated integers >= 0 (context lengths)."""
    return _int_list(text, 0)


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0 (a time budget, a CPU share)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def json_path_arg(text: str) -> Path:
    """An argparse ``type`` for ``--json``: checked before a long run, not after it."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; name a file, e.g. {str(path / 'bench.json')!r}")
    blocker = file_in_the_way(path.parent)
    if blocker is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: {str(blocker)!r} is a file, not a folder")
    return path


def folder_path_arg(text: str) -> Path:
    """An argparse ``type`` for an output folder (``--plots``): checked before a long run, not after it."""
    blocker = file_in_the_way(text)
    if blocker is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: {str(blocker)!r} is a file, not a folder")
    return Path(text)


def run_bench(args: argparse.Namespace) -> int:
    """Run the chosen bench; bad option values that only its configs can judge exit with their names."""
    from pydantic import ValidationError

    try:
        result = args.bench(args)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"])
            problems.append(f"{exc.title}.{field}: {error['msg']} (got {error.get('input')!r})" if field else f"{exc.title}: {error['msg']}")
        raise SystemExit(f"raydec bench {args.which}: bad option value: {'; '.join(problems)}") from None
    except (FileNotFoundError, CheckpointError) as exc:  # a missing model, or one unfit for this bench
        raise SystemExit(f"raydec bench {args.which}: {exc}") from None
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


def write_json(path: Path | None, result: dict) -> None:
    """A bench result as indented JSON, folders made as needed (paths and other objects as text);
    nothing when ``path`` is None."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))


def parse_methods(text: str, known: tuple[str, ...], baseline: str | None = "ar") -> list[str]:
    """``--methods``: a non-empty comma-separated subset of ``known`` that includes ``baseline``
    (the "ar" every speedup is measured against; None: no baseline needed)."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in known]
    if unknown or not methods:
        what = f"unknown {', '.join(unknown)}" if unknown else "none given"
        raise SystemExit(f"--methods: {what} (choose from {', '.join(known)})")
    repeated = sorted({m for m in methods if methods.count(m) > 1})
    if repeated:  # a repeat would run twice into one record and skew every ratio against it
        raise SystemExit(f"--methods {text!r}: {', '.join(repeated)} named more than once")
    if baseline is not None and baseline not in methods:
        raise SystemExit(f"--methods {text!r}: add {baseline!r}; every speedup is measured against it in the same run")
    return methods


def ratio_cell(entry: dict, key: str) -> str:
    """A table cell for an optional ratio: '-' when its baseline was not run."""
    return f"{entry[key]:.2f}" if key in entry else "-"


def resolve_device(name: str) -> str:
    """``--device``: "cpu", "cuda", "cuda:N" or "auto" (cuda when torch sees a GPU, else cpu)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise SystemExit(f"--device: expected cpu, cuda, cuda:N or auto, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: torch {torch.__version__} sees no CUDA device (a CPU-only build, or no GPU)")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise SystemExit(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s), numbered from 0")
    return name
