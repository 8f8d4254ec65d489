"""`raydec bench pipeline`: rows per second through the Ray Data pipeline (1 worker) vs the engine direct.

Both sides get the same validated rows (prompts and seeds from one Parquet file), the same
model, dtype, decode config, batch size and torch threads:

- **direct**: `raydec.api.load_target` then `raydec.api.generate_images` in this process,
  `batch_size` rows per call (images decoded to PIL, nothing written).
- **pipeline**: `raydec.runtime.run_job` with a 1-actor pool on a local Ray cluster (started
  here unless Ray is already up): preflight, Ray Data `map_batches` over a `GenerationWorker`
  that loads the model once, generates, writes PNGs and result shards; then verification and
  the manifest.

The two sides run in alternating rounds (direct then pipeline, then pipeline then direct, ...)
on a Ray cluster started once, so drift in machine load hits both alike; every pipeline round
is a fresh `run_job` (new actor, model loaded again). Efficiencies are pipeline rows/s ÷
direct rows/s:

- `pipeline_efficiency` = `steady_state_efficiency`: throughput once the model is loaded,
  from the first finished batch to the last on each side (first batch excluded on both, so
  the direct side's warm-up is not held against it either), pooled over rounds. This is what
  the pipeline costs per row: Ray Data scheduling and transfers, PNG and Parquet writing,
  and the CPU that Ray's own processes take from the actor.
- `end_to_end_efficiency`: one job from cold — direct model load + generation vs Ray start +
  `run_job` (actor process start, imports, model load, verification, manifest). The one-time
  costs dominate it at small row counts.
- `median_batch_efficiency`: the same steady state from the median time per row of single
  batches (actor: interval between consecutive shards) instead of the pooled total, so a
  load spike from another job during a few batches moves it little.
- `cpu_efficiency`: direct CPU seconds per row ÷ pipeline CPU seconds per row (this process
  and all its descendants, i.e. the whole local Ray cluster), steady state: a cross-check
  that is less sensitive than wall time to other jobs sharing the CPUs, though not immune
  (Linux only; None elsewhere).

The pipeline's batch completion times are the modification times of the result shards its
actor writes, one per batch (same machine, same clock as the driver).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from raydec.api import generate_images, load_target
from raydec.bench.common import folder_path_arg, json_path_arg, non_negative_int, positive_float, positive_int, print_table
from raydec.config import IMAGE_METHODS, DecodeConfig, JacobiDraftConfig
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample

logger = logging.getLogger(__name__)

def _shard_marks(output: Path) -> List[tuple[float, int]]:
    """(epoch seconds, rows done) per result shard the actor wrote, in write order.

    The worker flushes one shard per batch before returning it, so a shard's mtime is when
    that batch became durable in the actor. (The driver sees batches later and bunched: Ray
    Data hands finished blocks to the driver's iterator in groups, so driver-side arrival
    times do not measure the actor's pace.)
    """
    import pyarrow.parquet as pq

    shards = sorted((path.stat().st_mtime, pq.read_metadata(path).num_rows) for path in (output / "results").glob("part-*.parquet"))
    marks, done = [], 0
    for mtime, rows in shards:
        done += rows
        marks.append((mtime, done))
    return marks


def _decode_config(args: argparse.Namespace) -> Any:
    if args.method == "ar":
        return DecodeConfig(method="ar")
    tree = dict(branching=args.branching, tree_depth=args.tree_depth) if args.method == "sjd_pac" else {}
    return DecodeConfig(method=args.method, jacobi=JacobiDraftConfig(window=args.window, **tree))


def _write_prompts(path: Path, rows: int, seed: int) -> None:
    """`rows` held-out shapes prompts with explicit ids and seeds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompts = [make_sample(HELD_OUT_SEED_START + index).prompt for index in range(rows)]
    pq.write_table(
        pa.table({"id": [f"bench-{i:05d}" for i in range(rows)], "prompt": prompts, "seed": [seed + i for i in range(rows)]}),
        path,
    )


def _steady(marks: List[tuple[float, int]]) -> Optional[Dict[str, float]]:
    """Rows and seconds from the first finished batch to the last; None with fewer than 2 batches."""
    if len(marks) < 2:
        return None
    (first_t, first_rows), (last_t, last_rows) = marks[0], marks[-1]
    rows, seconds = last_rows - first_rows, last_t - first_t
    if rows <= 0 or seconds <= 0:
        return None
    batch_s_per_row = [(t1 - t0) / (r1 - r0) for (t0, r0), (t1, r1) in zip(marks, marks[1:]) if r1 > r0]
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, "s_per_row": seconds / rows,
            "batch_s_per_row": batch_s_per_row}


class _CpuSampler:
    """Samples, once a second, the CPU seconds used by this process and all its descendants.

    A local Ray cluster started by this process (GCS, raylet, the actor) is among them, so the
    pipeline's CPU per row counts every Ray process, not only the actor. Linux (/proc) only;
    elsewhere `cpu_between` returns None.
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        import threading

        self.interval_s = interval_s
        self.samples: List[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-cpu-sampler", daemon=True)
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _total(self) -> Optional[float]:
        if not os.path.isdir("/proc"):
            return None
        parents: Dict[int, int] = {}
        cpu: Dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stream:
                    fields = stream.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / self._ticks  # utime + stime
        family, grew = {os.getpid()}, True
        while grew:
            children = {pid for pid, parent in parents.items() if parent in family} - family
            grew = bool(children)
            family |= children
        return sum(cpu.get(pid, 0.0) for pid in family)

    def _loop(self) -> None:
        while not self._stop.is_set():
            total = self._total()
            if total is None:
                return
            self.samples.append((time.time(), total))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "_CpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_between(self, start: float, end: float) -> Optional[float]:
        """CPU seconds used between two epoch times (samples nearest to each), or None."""
        if len(self.samples) < 2 or end <= start:
            return None
        first = min(self.samples, key=lambda sample: abs(sample[0] - start))
        last = min(self.samples, key=lambda sample: abs(sample[0] - end))
        seconds = last[0] - first[0]
        return (last[1] - first[1]) * (end - start) / seconds if seconds > 0 else None


def _run_direct(job: Any, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Load (cached after the first round) and generate in this process, batch by batch."""
    started = time.time()
    target = load_target(job.model, "t2i", dtype=getattr(torch, job.dtype), device="cpu")
    loaded = time.time()
    marks: List[tuple[float, int]] = []
    cpu_marks: List[float] = []
    batch_size = job.pool.batch_size
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        results = generate_images(
            [row["prompt"] for row in batch], model=target, decode=job.decode,
            seeds=[int(row["seed"]) for row in batch], batch_size=batch_size,
        )
        if len(results) != len(batch):
            raise RuntimeError(f"bench pipeline: generate_images returned {len(results)} results for {len(batch)} rows")
        marks.append((time.time(), start + len(batch)))
        cpu_marks.append(time.process_time())
    finished = time.time()
    steady = _steady(marks)
    if steady and len(cpu_marks) >= 2:
        steady["cpu_s_per_row"] = (cpu_marks[-1] - cpu_marks[0]) / steady["rows"]
    return {
        "load_s": loaded - started,
        "generate_s": finished - loaded,
        "first_batch_s": marks[0][0] - loaded,
        "steady": steady,
    }


def _run_pipeline(job: Any, output: Path) -> Dict[str, Any]:
    """run_job with 1 actor on the running Ray cluster; batch completion times from the actor's shards."""
    from raydec.runtime import preflight, run_job  # lazy: keeps raydec bench --help light

    with _CpuSampler() as sampler:
        started = time.time()  # wall clock: compared with the shard files' mtimes
        report = run_job(job, preflight(job))
        finished = time.time()
    if report.processed != report.input_rows or report.result_errors:
        raise RuntimeError(f"bench pipeline: job did not process every row cleanly: {report.counts()}")
    marks = _shard_marks(output)
    steady = _steady(marks)
    if steady:
        cpu = sampler.cpu_between(marks[0][0], marks[-1][0])
        steady["cpu_s_per_row"] = cpu / steady["rows"] if cpu is not None else None
    generate_s = report.timings.get("generate_s", 0.0)
    prepare_s = report.timings.get("prepare_s", 0.0)
    first_batch_s = marks[0][0] - started if marks else None
    startup = None
    if steady and first_batch_s is not None:  # time to the first batch, less one steady batch
        startup = first_batch_s - prepare_s - marks[0][1] * steady["s_per_row"]
    return {
        "run_job_s": finished - started,
        "prepare_s": prepare_s,
        "generate_s": generate_s,
        "verify_manifest_s": max(0.0, report.timings.get("total_s", 0.0) - prepare_s - generate_s),
        "first_batch_s": first_batch_s,
        "actor_start_and_model_load_s_est": startup,
        "last_batch_to_end_s": finished - marks[-1][0] if marks else None,
        "workers_seen": report.workers_seen,
        "steady": steady,
    }


def _pooled(steadies: List[Optional[Dict[str, float]]]) -> Optional[Dict[str, float]]:
    """Steady-state figures summed over rounds (rows / seconds pooled, CPU per row averaged by rows)."""
    valid = [s for s in steadies if s]
    if not valid:
        return None
    rows, seconds = sum(s["rows"] for s in valid), sum(s["seconds"] for s in valid)
    cpu = [s.get("cpu_s_per_row") for s in valid]
    return {
        "rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, "s_per_row": seconds / rows,
        "median_batch_s_per_row": statistics.median(b for s in valid for b in s["batch_s_per_row"]),
        "cpu_s_per_row": sum(c * s["rows"] for c, s in zip(cpu, valid)) / rows if all(c is not None for c in cpu) else None,
    }


def _mean(values: List[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def bench_pipeline(args: argparse.Namespace) -> dict:
    """Direct engine vs 1-worker Ray pipeline on the same rows, in alternating rounds."""
    import ray

    from raydec.io import load_rows  # lazy: keeps raydec bench --help light
    from raydec.runtime import JobConfig, connect_ray  # lazy: keeps raydec bench --help light

    if args.rows <= args.batch_size:
        raise SystemExit(
            f"--rows {args.rows}: give more rows than --batch-size {args.batch_size}; the steady state leaves out "
            "each side's first batch, so one batch measures nothing"
        )
    decode = _decode_config(args)  # bad draft options fail here, before any folder or model
    torch.set_num_threads(args.threads)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="raydec_bench_pipeline_"))
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.parquet"

    def job_for(round_index: int) -> Any:
        output = work / f"out_{round_index}"
        shutil.rmtree(output, ignore_errors=True)  # a fresh output: resume must not skip rows
        return JobConfig(
            task="t2i", model=str(args.model), dtype=args.dtype,
            input={"path": str(prompts)}, output={"path": str(output)},
            decode=decode,
            pool={"workers": 1, "batch_size": args.batch_size, "cpus_per_worker": args.cpus_per_worker,
                  "torch_threads": args.threads},
        )

    direct_rounds: List[Dict[str, Any]] = []
    pipeline_rounds: List[Dict[str, Any]] = []
    ray_start_s, ray_was_running = None, ray.is_initialized()
    try:
        _write_prompts(prompts, args.rows, args.seed)
        job = job_for(0)  # a bad pool option fails here; the finally still removes the folder
        rows = load_rows(job.input, "t2i")
        for round_index in range(args.rounds):
            job = job_for(round_index)
            # Alternate the order (D P, P D, D P, ...) so drift in machine load hits both sides alike.
            order = ("direct", "pipeline") if round_index % 2 == 0 else ("pipeline", "direct")
            for side in order:
                if side == "direct":
                    direct_rounds.append(_run_direct(job, rows))
                    continue
                if ray_start_s is None:
                    begin = time.time()
                    connect_ray()
                    ray_start_s = time.time() - begin
                pipeline_rounds.append(_run_pipeline(job, Path(job.output.path)))
            logger.info("bench pipeline: round %d/%d done", round_index + 1, args.rounds)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return _summarise(args, job, len(rows), direct_rounds, pipeline_rounds, ray_start_s, ray_was_running)


def _summarise(
    args: argparse.Namespace, job: Any, rows: int, direct_rounds: List[Dict[str, Any]],
    pipeline_rounds: List[Dict[str, Any]], ray_start_s: float, ray_was_running: bool,
) -> dict:
    direct_steady = _pooled([r["steady"] for r in direct_rounds])
    pipeline_steady = _pooled([r["steady"] for r in pipeline_rounds])
    steady_eff = pipeline_steady["rows_per_s"] / direct_steady["rows_per_s"] if direct_steady and pipeline_steady else None
    median_eff = None
    if direct_steady and pipeline_steady:
        median_eff = direct_steady["median_batch_s_per_row"] / pipeline_steady["median_batch_s_per_row"]
    cpu_eff = None
    if direct_steady and pipeline_steady and direct_steady["cpu_s_per_row"] and pipeline_steady["cpu_s_per_row"]:
        cpu_eff = direct_steady["cpu_s_per_row"] / pipeline_steady["cpu_s_per_row"]
    # End to end, one job from cold: direct = first (cold) model load + mean generation time;
    # pipeline = Ray start + mean run_job time (each run_job starts its own actor and loads the model).
    direct_wall = direct_rounds[0]["load_s"] + _mean([r["generate_s"] for r in direct_rounds])
    pipeline_wall = ray_start_s + _mean([r["run_job_s"] for r in pipeline_rounds])
    per_row = {
        "direct": direct_steady["s_per_row"] if direct_steady else None,
        "pipeline": pipeline_steady["s_per_row"] if pipeline_steady else None,
    }
    per_row["extra"] = per_row["pipeline"] - per_row["direct"] if None not in per_row.values() else None
    breakdown = {
        "extra_wall_s": pipeline_wall - direct_wall,
        "ray_start_s": ray_start_s,
        "ray_was_running": ray_was_running,
        "prepare_s": _mean([r["prepare_s"] for r in pipeline_rounds]),
        "actor_start_and_model_load_s_est": _mean([r["actor_start_and_model_load_s_est"] for r in pipeline_rounds]),
        "direct_model_load_s": direct_rounds[0]["load_s"],
        "steady_s_per_row": per_row,
        "steady_extra_s_total": per_row["extra"] * rows if per_row["extra"] is not None else None,
        "last_batch_to_end_s": _mean([r["last_batch_to_end_s"] for r in pipeline_rounds]),
        "verify_manifest_s": _mean([r["verify_manifest_s"] for r in pipeline_rounds]),
    }
    per_round = [
        {"direct_rows_per_s": d["steady"]["rows_per_s"] if d["steady"] else None,
         "pipeline_rows_per_s": p["steady"]["rows_per_s"] if p["steady"] else None,
         "efficiency": p["steady"]["rows_per_s"] / d["steady"]["rows_per_s"] if d["steady"] and p["steady"] else None}
        for d, p in zip(direct_rounds, pipeline_rounds)
    ]
    result = {
        "pipeline_efficiency": steady_eff,
        "pipeline_efficiency_definition": (
            "steady state: pipeline rows/s / direct rows/s, each from its first finished batch to its last "
            "(model loaded, first batch excluded on both sides), pooled over alternating rounds"
        ),
        "steady_state_efficiency": steady_eff,
        "end_to_end_efficiency": direct_wall / pipeline_wall,
        "median_batch_efficiency": median_eff,
        "cpu_efficiency": cpu_eff,
        "rows": rows,
        "rounds": args.rounds,
        "direct": {
            "rows_per_s": direct_steady["rows_per_s"] if direct_steady else None,
            "end_to_end_rows_per_s": rows / direct_wall, "wall_s": direct_wall,
            "steady": direct_steady, "per_round": direct_rounds,
        },
        "pipeline": {
            "rows_per_s": pipeline_steady["rows_per_s"] if pipeline_steady else None,
            "end_to_end_rows_per_s": rows / pipeline_wall, "wall_s": pipeline_wall,
            "steady": pipeline_steady, "per_round": pipeline_rounds,
        },
        "per_round": per_round,
        "breakdown": breakdown,
        "config": {
            "model": str(args.model), "method": job.decode.method, "dtype": job.dtype, "rows": rows,
            "rounds": args.rounds, "batch_size": job.pool.batch_size, "workers": 1,
            "cpus_per_worker": job.pool.cpus_per_worker, "torch_threads": args.threads, "seed": args.seed,
            "decode": job.decode.model_dump(),
        },
    }
    _print(result)
    return result


def _fmt(value: Optional[float], spec: str = ".3f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _print(result: dict) -> None:
    direct, pipeline, breakdown, config = result["direct"], result["pipeline"], result["breakdown"], result["config"]
    per_row = breakdown["steady_s_per_row"]
    first_direct = _mean([r["first_batch_s"] for r in direct["per_round"]])
    first_pipeline = _mean([r["first_batch_s"] for r in pipeline["per_round"]])
    table = [
        ["Ray start (once)", "-", _fmt(breakdown["ray_start_s"], ".2f", " s")],
        ["read + validate rows", "-", _fmt(breakdown["prepare_s"], ".2f", " s")],
        ["model load", _fmt(breakdown["direct_model_load_s"], ".2f", " s"),
         _fmt(breakdown["actor_start_and_model_load_s_est"], ".2f", " s (actor start + load, est.)")],
        ["first batch done after", _fmt(first_direct, ".2f", " s"), _fmt(first_pipeline, ".2f", " s")],
        ["steady s / row", _fmt(per_row["direct"], ".3f"), _fmt(per_row["pipeline"], ".3f")],
        ["steady rows / s", _fmt(direct["rows_per_s"]), _fmt(pipeline["rows_per_s"])],
        ["median batch s / row", _fmt(direct["steady"]["median_batch_s_per_row"] if direct["steady"] else None),
         _fmt(pipeline["steady"]["median_batch_s_per_row"] if pipeline["steady"] else None)],
        ["steady CPU s / row", _fmt(direct["steady"]["cpu_s_per_row"] if direct["steady"] else None),
         _fmt(pipeline["steady"]["cpu_s_per_row"] if pipeline["steady"] else None, ".3f", " (all Ray processes)")],
        ["last batch -> job end", "-", _fmt(breakdown["last_batch_to_end_s"], ".2f", " s (to driver, verify, manifest)")],
        ["wall, one job from cold", _fmt(direct["wall_s"], ".2f", " s"), _fmt(pipeline["wall_s"], ".2f", " s")],
        ["rows / s end to end", _fmt(direct["end_to_end_rows_per_s"]), _fmt(pipeline["end_to_end_rows_per_s"])],
    ]
    print_table(
        f"bench pipeline: {config['model']}, {config['method']}, {config['dtype']}, {result['rows']} rows x "
        f"{result['rounds']} round(s), batch {config['batch_size']}, 1 worker ({config['cpus_per_worker']} CPU), "
        f"{config['torch_threads']} torch thread(s)",
        ["", "direct", "pipeline"], table,
    )
    rounds = ", ".join(_fmt(r["efficiency"]) for r in result["per_round"])
    print(f"pipeline_efficiency (steady state) = {_fmt(result['pipeline_efficiency'])} (per round: {rounds})   "
          f"end_to_end_efficiency = {_fmt(result['end_to_end_efficiency'])}   "
          f"median_batch_efficiency = {_fmt(result['median_batch_efficiency'])}   "
          f"cpu_efficiency = {_fmt(result['cpu_efficiency'])}   extra steady s/row = {_fmt(per_row['extra'], '.4f')}")


def add_pipeline_parser(subparsers) -> None:
    parser = subparsers.add_parser("pipeline", help="Ray Data pipeline (1 worker) vs the engine direct: rows/s")
    parser.add_argument("--model", default="reference", help='"reference" or a local Janus / Emu3 checkpoint folder')
    parser.add_argument("--method", choices=IMAGE_METHODS, default="ar")
    parser.add_argument("--rows", type=positive_int, default=48, help="held-out shapes prompts (same rows on both sides)")
    parser.add_argument("--rounds", type=positive_int, default=2, help="direct / pipeline runs each, order alternating")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="rows per engine call / actor call")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float64"], default="float32")
    parser.add_argument("--window", type=positive_int, default=16, help="sjd*: draft nodes per step")
    parser.add_argument("--branching", type=positive_int, default=2, help="sjd_pac: candidates per tree level")
    parser.add_argument("--tree-depth", type=non_negative_int, default=2, help="sjd_pac: tree levels")
    parser.add_argument("--cpus-per-worker", type=positive_float, default=0.5, help="Ray CPUs reserved by the actor")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads, direct and in the actor")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="row i gets seed SEED + i")
    parser.add_argument("--work-dir", type=folder_path_arg, default=None, help="keep the prompts and pipeline outputs here")
    parser.add_argument("--json", type=json_path_arg, default=None, help="write results here")
    parser.set_defaults(bench=bench_pipeline)
