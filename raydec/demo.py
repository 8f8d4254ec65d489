"""`raydec demo`: the quickstart batch jobs on the shipped reference models, on a local Ray cluster.

It writes examples/prompts.parquet (held-out shapes prompts) if missing, starts Ray on
127.0.0.1, then runs two Ray Data jobs:

1. text-to-image with SJD-PAC on the reference Janus -> out/images/, out/results/, out/manifest.json
2. captioning of those images with ViSpec on the reference LLaVA (AR when no draft is
   shipped) -> out/captions/results/, out/captions/manifest.json

and writes out/contact_sheet.png (image, prompt, caption). Last, it times both methods
against plain AR on the job's first few rows (their prompts, seeds and written images) in this
process and prints the speedups. A re-run
resumes: rows already in out/ are skipped (use --fresh to start over); an out/ written with
another model or decode config is refused rather than mixed. Results made with earlier
*shipped* reference weights (the settings equal, the weights updated since) are the demo's own
and out of date: they are replaced, with a warning, so `make demo` keeps working after an update.
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

from raydec.bench.common import non_negative_int, positive_int
from raydec.models.registry import REFERENCE_DRAFT_DIRS, resolve_t2i_path
from raydec.validation import validation_problems

logger = logging.getLogger(__name__)

EXAMPLE_PROMPTS = Path("examples/prompts.parquet")
DEMO_ROWS = 16
TRAIN_HINT = "python -m raydec.reference.train t2i   (see specs/reference-models.md)"


def write_example_prompts(path: Path, rows: int = DEMO_ROWS) -> Path:
    """Write `rows` held-out shapes prompts (ids heldout-000, ...) as Parquet."""
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample  # lazy: keeps raydec demo --help light

    prompts = [make_sample(HELD_OUT_SEED_START + index).prompt for index in range(rows)]
    ids = [f"heldout-{index:03d}" for index in range(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "prompt": prompts}), path)
    logger.info("wrote %d example prompts to %s", rows, path)
    return path


def default_method() -> str:
    """SJD-PAC when its proposer is present in this build, else plain AR."""
    return "sjd_pac" if importlib.util.find_spec("raydec.speculative.proposers.jacobi") else "ar"


def demo_decode(method: str) -> dict:
    """The demo's text-to-image decode config. SJD-PAC gets the window, proactive tree and
    fresh-draft prior (left copies: the reference shapes repeat codes along rows) that
    ``raydec bench t2i`` tuned for the reference Janus on a 2-core CPU."""
    if method == "sjd_pac":
        return {"method": method, "jacobi": {"window": 32, "branching": 2, "tree_depth": 1, "init": "left"}}
    return {"method": method}


def caption_method() -> str:
    """ViSpec when the reference VLM's draft is shipped, else plain AR."""
    return "vispec" if (REFERENCE_DRAFT_DIRS["vispec"] / "draft_config.json").is_file() else "ar"


def reference_ready(model: str) -> bool:
    """Whether `model` ("reference" or a folder) has a config.json to load."""
    return (resolve_t2i_path(model) / "config.json").is_file()


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raydec demo", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=EXAMPLE_PROMPTS, help="input Parquet (created if missing)")
    parser.add_argument("--out", type=Path, default=Path("out"), help="output folder")
    parser.add_argument("--model", default="reference", help="'reference' or a Janus checkpoint folder")
    parser.add_argument("--method", default=None, help="decode method (default: sjd_pac if available, else ar)")
    parser.add_argument("--workers", type=positive_int, default=2, help="actors in the pool")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="rows per actor call")
    parser.add_argument("--rows", type=positive_int, default=DEMO_ROWS, help="rows when creating --prompts")
    parser.add_argument("--fresh", action="store_true", help="delete earlier demo results in --out first")
    parser.add_argument("--caption-method", default=None, help="captioning method (default: vispec if shipped, else ar)")
    parser.add_argument("--no-captions", action="store_true", help="skip the captioning job")
    parser.add_argument(
        "--speedup-rows", type=non_negative_int, default=4,
        help="first rows of the job re-run with its method and with AR to measure speedups (0: skip)",
    )
    return parser.parse_args(argv)


def _clear(out: Path) -> None:
    for name in ("images", "results", "captions"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in ("manifest.json", "contact_sheet.png"):
        (out / name).unlink(missing_ok=True)


def _job_lines(job, report, what: str) -> List[str]:
    """Summary lines of one job's results."""
    from raydec.io import read_results  # lazy: keeps raydec demo --help light

    rows = read_results(job.output).to_pylist()
    good = [r for r in rows if r["error"] is None]
    mean = lambda key: sum(r[key] for r in good) / max(1, len(good))  # noqa: E731
    return [
        f"{what}: {len(rows)} result(s) in {job.output.path} ({len(good)} ok, {len(rows) - len(good)} errors); "
        f"method {job.decode.method}, model {job.model}, {job.pool.workers} worker(s); "
        f"this run processed {report.processed} row(s) in {report.timings.get('generate_s', 0.0):.1f}s",
        f"  per row: {mean('tokens'):.0f} tokens, {mean('target_forwards'):.1f} target forwards, "
        f"{mean('tokens_per_forward'):.2f} tokens per forward, {mean('latency_s'):.2f}s decode latency",
    ]


def measure_speedups(t2i_job, caption_job, rows: int) -> List[str]:
    """Time each job's method against plain AR on the job's first ``rows`` good rows, in this
    process: their prompts and seeds, then the images the job wrote with the caption job's seeds
    (both methods in one process, so machine noise hits both)."""
    import torch
    from PIL import Image

    from raydec.api import caption_images, generate_images, load_target  # lazy: keeps raydec demo --help light
    from raydec.io import read_results  # lazy: keeps raydec demo --help light

    torch.set_num_threads(1)
    done = sorted((r for r in read_results(t2i_job.output).to_pylist() if r["error"] is None), key=lambda r: r["id"])[:rows]
    if not done:
        return ["  speedups: no good text-to-image rows to re-run"]
    lines, timings = [], {}
    prompts, seeds = [r["prompt"] for r in done], [int(r["seed"]) for r in done]
    target = load_target(t2i_job.model, "t2i")
    for method in (t2i_job.decode.method, "ar"):
        decode = t2i_job.decode.model_copy(update={"method": method})
        start = time.perf_counter()
        results = generate_images(prompts, model=target, decode=decode, seeds=seeds, batch_size=1)
        timings[method] = (time.perf_counter() - start, sum(r.target_forwards for r in results))
    (spec_s, spec_f), (ar_s, ar_f) = timings[t2i_job.decode.method], timings["ar"]
    lines.append(f"  text-to-image {t2i_job.decode.method} vs AR on {len(done)} prompts (batch 1): "
                 f"{ar_f / spec_f:.2f}x fewer target forwards, {ar_s / spec_s:.2f}x latency speedup")
    if caption_job is not None:
        caption_seeds = {r["id"]: int(r["seed"]) for r in read_results(caption_job.output).to_pylist()}
        pairs = [(Image.open(r["output_uri"]).convert("RGB"), caption_seeds[r["id"]]) for r in done if r["id"] in caption_seeds]
        images, seeds = [image for image, _ in pairs], [seed for _, seed in pairs]
        vlm = load_target(caption_job.model, "caption")
        for method in (caption_job.decode.method, "ar"):
            decode = caption_job.decode.model_copy(update={"method": method})
            start = time.perf_counter()
            results = caption_images(images, model=vlm, decode=decode, seeds=seeds, batch_size=1)
            timings[method] = (time.perf_counter() - start, sum(r.target_forwards for r in results), [r.caption for r in results])
        spec, ar = timings[caption_job.decode.method], timings["ar"]
        same = sum(a == b for a, b in zip(spec[2], ar[2]))
        lines.append(f"  captioning {caption_job.decode.method} vs AR on {len(images)} images (batch 1): "
                     f"{ar[1] / spec[1]:.2f}x fewer target forwards, {ar[0] / spec[0]:.2f}x latency speedup, "
                     f"{same}/{len(images)} captions identical to AR's")
    return lines


def _demo_jobs(args: argparse.Namespace):
    """The demo's text-to-image job and (unless --no-captions) its captioning job, validated."""
    from raydec.runtime import JobConfig  # lazy: keeps raydec demo --help light

    job = JobConfig.model_validate(dict(
        task="t2i", model=args.model, dtype="float32", seed=0,
        input={"path": str(args.prompts.resolve())}, output={"path": str(args.out.resolve())},
        decode=demo_decode(args.method or default_method()),
        pool={"workers": args.workers, "batch_size": args.batch_size, "cpus_per_worker": 0.5},
    ))
    # captions of the images just written: their result shards are the caption job's input
    # (their `prompt` column is the text-to-image prompt, not a question: read no prompt column)
    caption_job = None if args.no_captions else JobConfig.model_validate(dict(
        task="caption", model="reference", dtype="float32", seed=0,
        input={"path": str((args.out / "results").resolve()), "image_uri_column": "output_uri", "prompt_column": "instruction"},
        output={"path": str((args.out / "captions").resolve())},
        decode={"method": args.caption_method or caption_method(), "draft_tree": None},  # the default tree, not 'auto': no tuning in the demo
        pool={"workers": args.workers, "batch_size": args.batch_size, "cpus_per_worker": 0.5},
    ))
    return job, caption_job


def resume_or_replace(check, clear, where: Path, replace_stale_weights: bool):
    """``check()`` (a resume check); if it fails only because the weights changed and
    ``replace_stale_weights``, ``clear()`` the out-of-date results and check again."""
    from raydec.runtime import ResumeMismatchError  # lazy: keeps raydec demo --help light

    try:
        return check()
    except ResumeMismatchError as exc:
        if exc.field != "weights" or not replace_stale_weights:
            raise
        print(f"raydec demo: {where} holds results of earlier shipped weights; replacing them ({exc.detail})", file=sys.stderr)
        clear()
        return check()


def main(argv: Optional[List[str]] = None) -> int:
    """Run the demo; returns a process exit code."""
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.prompts.exists():
        write_example_prompts(args.prompts, args.rows)
    if not reference_ready(args.model):
        print(
            f"raydec demo: no text-to-image model at {resolve_t2i_path(args.model)}.\n"
            f"The reference Janus is trained, not downloaded. Train it (CPU, offline) with:\n  {TRAIN_HINT}\n"
            f"or pass --model PATH to a Janus checkpoint folder.",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()

    from pydantic import ValidationError

    from raydec.runtime import (  # lazy: keeps raydec demo --help light
        ResumeMismatchError,
        check_resume_compatible,
        init_local_ray,
        preflight,
        run_job,
    )
    from raydec.runtime.contact_sheet import contact_sheet  # lazy: keeps raydec demo --help light

    try:
        job, caption_job = _demo_jobs(args)
    except ValidationError as exc:  # e.g. --method sjdpac: say so before --fresh deletes anything
        problems = "; ".join(validation_problems(exc))
        print(f"raydec demo: bad option: {problems}", file=sys.stderr)
        return 2
    if args.fresh:
        _clear(args.out)
    captions_out = args.out / "captions"
    try:  # the shipped reference models change with raydec: their stale demo results are replaced
        files = resume_or_replace(lambda: preflight(job), lambda: _clear(args.out), args.out, args.model == "reference")
        if caption_job is not None:
            resume_or_replace(lambda: check_resume_compatible(caption_job), lambda: shutil.rmtree(captions_out),
                              captions_out, True)
    except ResumeMismatchError as exc:
        print(f"raydec demo: {args.out} holds an earlier run with other settings ({exc}).\n"
              f"Rerun with --fresh to replace it, or pass --out NEW_FOLDER.", file=sys.stderr)
        return 2
    import ray

    own_cluster = not ray.is_initialized()
    init_local_ray()
    try:
        report = run_job(job, files)
        caption_report = run_job(caption_job, preflight(caption_job)) if caption_job is not None else None
    finally:
        if own_cluster:
            ray.shutdown()
    sheet = _write_sheet(job, caption_job, contact_sheet)
    lines = [f"raydec demo ({time.perf_counter() - started:.1f}s)"] + _job_lines(job, report, "text-to-image")
    if caption_job is not None:
        lines += _job_lines(caption_job, caption_report, "captioning")
    lines += [f"  contact sheet: {sheet}", f"  manifests:     {Path(job.output.path) / 'manifest.json'}"
              + (f", {Path(caption_job.output.path) / 'manifest.json'}" if caption_job else "")]
    print("\n".join(lines), flush=True)
    if args.speedup_rows > 0:
        print("\n".join(measure_speedups(job, caption_job, args.speedup_rows)))
    return 0


def _write_sheet(job, caption_job, contact_sheet) -> Path:
    """Write out/contact_sheet.png of every result, in id order: image, prompt, caption."""
    from PIL import Image

    from raydec.io import read_results  # lazy: keeps raydec demo --help light

    captions_by_id = {}
    if caption_job is not None:
        captions_by_id = {r["id"]: r["caption"] or f"[{r['error']}]" for r in read_results(caption_job.output).to_pylist()}
    images, texts = [], []
    for row in read_results(job.output).to_pylist():
        images.append(Image.open(row["output_uri"]) if row["output_uri"] else None)
        text = row["prompt"] or f"[{row['error']}]"
        if row["id"] in captions_by_id:
            text += f" -> {captions_by_id[row['id']]}"
        texts.append(text)
    title = f"raydec demo: {job.model} ({job.decode.method})" + (f"; captions {caption_job.decode.method}" if caption_job else "")
    sheet = contact_sheet(images, texts, title=title)
    path = Path(job.output.path) / "contact_sheet.png"
    sheet.save(path)
    return path
