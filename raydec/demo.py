"""`raydec demo`: the quickstart batch job on the shipped reference Janus, on a local Ray cluster.

It writes examples/prompts.parquet (held-out shapes prompts) if missing, starts Ray on
127.0.0.1, runs the t2i batch pipeline (SJD-PAC when available, else AR), and writes
under out/: images/, results/, manifest.json and contact_sheet.png. A re-run resumes:
rows already in out/ are skipped (use --fresh to start over).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import List, Optional

import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

EXAMPLE_PROMPTS = Path("examples/prompts.parquet")
DEMO_ROWS = 16
TRAIN_HINT = "python -m raydec.reference.train t2i   (see specs/reference-models.md)"


def write_example_prompts(path: Path, rows: int = DEMO_ROWS) -> Path:
    """Write `rows` held-out shapes prompts (ids heldout-000, ...) as Parquet."""
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

    prompts = [make_sample(HELD_OUT_SEED_START + index).prompt for index in range(rows)]
    ids = [f"heldout-{index:03d}" for index in range(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "prompt": prompts}), path)
    logger.info("wrote %d example prompts to %s", rows, path)
    return path


def default_method() -> str:
    """SJD-PAC when its proposer is present in this build, else plain AR."""
    return "sjd_pac" if importlib.util.find_spec("raydec.spec.proposers.jacobi") else "ar"


def reference_ready(model: str) -> bool:
    """Whether `model` ("reference" or a folder) has a config.json to load."""
    from raydec.models.registry import resolve_t2i_path

    return (resolve_t2i_path(model) / "config.json").is_file()


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raydec demo", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=EXAMPLE_PROMPTS, help="input Parquet (created if missing)")
    parser.add_argument("--out", type=Path, default=Path("out"), help="output folder")
    parser.add_argument("--model", default="reference", help="'reference' or a Janus checkpoint folder")
    parser.add_argument("--method", default=None, help="decode method (default: sjd_pac if available, else ar)")
    parser.add_argument("--workers", type=int, default=2, help="actors in the pool")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per actor call")
    parser.add_argument("--rows", type=int, default=DEMO_ROWS, help="rows when creating --prompts")
    parser.add_argument("--fresh", action="store_true", help="delete earlier demo results in --out first")
    return parser.parse_args(argv)


def _clear(out: Path) -> None:
    for name in ("images", "results"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in ("manifest.json", "contact_sheet.png"):
        (out / name).unlink(missing_ok=True)


def _summary(job, report, sheet: Path, seconds: float) -> str:
    """Human-readable summary of the results under the job's output."""
    from raydec.io import read_results

    table = read_results(job.output)
    rows = [r for r in table.to_pylist()]
    good = [r for r in rows if r["error"] is None]
    mean = lambda key: sum(r[key] for r in good) / max(1, len(good))  # noqa: E731
    lines = [
        f"raydec demo: {len(rows)} result(s) in {job.output.path} ({len(good)} images, {len(rows) - len(good)} errors)",
        f"  method {job.decode.method}, model {job.model}, {job.pool.workers} worker(s), "
        f"this run generated {report.processed} row(s) in {report.timings.get('generate_s', 0.0):.1f}s "
        f"(demo total {seconds:.1f}s)",
        f"  per image: {mean('tokens'):.0f} tokens, {mean('target_forwards'):.1f} target forwards, "
        f"{mean('mean_accepted'):.2f} tokens per forward, {mean('latency_s'):.2f}s decode latency",
        f"  contact sheet: {sheet}",
        f"  manifest:      {Path(job.output.path) / 'manifest.json'}",
    ]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the demo; returns a process exit code."""
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.prompts.exists():
        write_example_prompts(args.prompts, args.rows)
    if not reference_ready(args.model):
        from raydec.models.registry import resolve_t2i_path

        print(
            f"raydec demo: no text-to-image model at {resolve_t2i_path(args.model)}.\n"
            f"The reference Janus is trained, not downloaded. Train it (CPU, offline) with:\n  {TRAIN_HINT}\n"
            f"or pass --model PATH to a Janus checkpoint folder.",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    if args.fresh:
        _clear(args.out)

    from raydec.runtime import JobConfig, init_local_ray, preflight, run_job
    from raydec.runtime.contact_sheet import contact_sheet

    job = JobConfig.model_validate(dict(
        task="t2i", model=args.model, dtype="float32", seed=0,
        input={"path": str(args.prompts.resolve())}, output={"path": str(args.out.resolve())},
        decode={"method": args.method or default_method()},
        pool={"workers": args.workers, "batch_size": args.batch_size, "cpus_per_worker": 0.5},
    ))
    files = preflight(job)
    import ray

    own_cluster = not ray.is_initialized()
    init_local_ray()
    try:
        report = run_job(job, files)
    finally:
        if own_cluster:
            ray.shutdown()
    sheet = _write_sheet(job, contact_sheet)
    print(_summary(job, report, sheet, time.perf_counter() - started))
    return 0


def _write_sheet(job, contact_sheet) -> Path:
    """Write out/contact_sheet.png of every result, in id order."""
    from PIL import Image

    from raydec.io import read_results

    images, captions = [], []
    for row in read_results(job.output).to_pylist():
        images.append(Image.open(row["output_uri"]) if row["output_uri"] else None)
        captions.append(row["prompt"] or f"[{row['error']}]")
    sheet = contact_sheet(images, captions, title=f"raydec demo: {job.model} ({job.decode.method})")
    path = Path(job.output.path) / "contact_sheet.png"
    sheet.save(path)
    return path
