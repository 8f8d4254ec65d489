"""The batch job driver: preflight, resume, a Ray Data pipeline read -> decode -> write, verification, manifest.

    files = preflight(job)                     # schema, model and output checks, before any model loads
    report = run_job(job, files)               # skips ids already written, writes the rest

The driver never holds rows. It lists the input's fragments (Parquet row groups from the
footers; CSV / JSON-lines files whole); a Ray task scans the input's and the output's id columns
(duplicate ids, and per fragment how many rows are done); read tasks stream the validated rows
of the fragments with rows left, dropping ids already done; an actor pool of `GenerationWorker`s
decodes them and writes results (bad rows get their error results there). At the end a second
scan checks exactly one result per input id. The manifest is written before generation starts
(status "running") and again at the end ("complete" / "incomplete", with counts, timings and
speed); it records the job config and a fingerprint of the weights, which a resume must match.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from raydec.config import parse_image_size
from raydec.io import InputFile, IOConfigError, check_dataset
from raydec.io.fragments import Fragment, plan_fragments
from raydec.io.id_index import IdScan, scan_ids
from raydec.io.storage import OutputLocation
from raydec.models.registry import (
    REFERENCE_NAME, T2I_LOADERS, check_vqgan_path, checkpoint_model_type, resolve_draft_path, resolve_t2i_path, resolve_vlm_path,
    t2i_size_problem,
)
from raydec.models.sources import ModelSourceError
from raydec.runtime.cluster import connect_ray
from raydec.runtime.config import JobConfig
from raydec.runtime.row_decoders import ROW_DECODERS
from raydec.runtime.reading import READ_TASK_CPUS, read_dataset
from raydec.runtime.resume import check_output, job_models
from raydec.runtime.planning import plan_job
from raydec.runtime.worker import GenerationWorker

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0
"""Seconds between progress lines (the first decoded rows and the last are always logged)."""


class JobIncompleteError(RuntimeError):
    """The job ended with input ids that have no result row."""


@dataclass
class JobReport:
    """What a job did: counts, seconds and where things are."""

    output: str
    input_rows: int = 0
    skipped_completed: int = 0
    validation_errors: int = 0
    processed: int = 0
    processing_errors: int = 0
    results: int = 0
    result_errors: int = 0
    workers_seen: int = 0
    timings: Dict[str, float] = field(default_factory=dict)
    missing_ids: List[str] = field(default_factory=list)
    per_worker: Dict[str, int] = field(default_factory=dict)  # rows each actor wrote this run
    per_node: Dict[str, int] = field(default_factory=dict)  # rows each Ray node wrote this run
    missing: int = 0  # input ids without a result (missing_ids names the first 100)
    plan: Optional[Dict[str, Any]] = None  # what the rows decode with and where it came from (DecodePlan.record)

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def counts(self) -> Dict[str, int]:
        data = asdict(self)
        return {k: v for k, v in data.items() if isinstance(v, int)}


class ModelNotFoundError(ValueError):
    """`model` names no checkpoint this build can load."""


def check_model(job: JobConfig) -> None:
    """The checkpoint exists with a config.json of a supported family (nothing is loaded); for
    captioning with vispec / eagle, its draft too.

    A hub id or ``s3://`` model is checked on its configs alone (fetched into this node's cache; no
    weights): each worker fetches the whole model on its own node. A local folder is checked where
    the driver runs; on a multi-node cluster it must also exist on the workers (a shared filesystem).
    """
    if job.task != "caption":
        _check_t2i_model(job)
        return
    from raydec.models.hf_vlm import SUPPORTED_VLMS  # lazy: VLM model code loads only for captioning jobs
    from raydec.models.vispec_draft import CONFIG_NAME, check_draft_fits  # lazy: VLM model code loads only for captioning jobs

    try:
        path = resolve_vlm_path(job.model, s3=job.input.s3, files="config")
        model_type = checkpoint_model_type(path)
    except ModelSourceError as exc:
        raise ModelNotFoundError(str(exc)) from None
    except (FileNotFoundError, ValueError) as exc:
        raise ModelNotFoundError(f"model: {job.model!r}: {exc}") from None
    if model_type not in SUPPORTED_VLMS:
        raise ModelNotFoundError(f"model: {job.model!r} is a {model_type!r} checkpoint; captioning supports {sorted(SUPPORTED_VLMS)}")
    method = job.decode.method
    if job.decode.sampling.cfg_scale != 1:
        raise ValueError(f"decode.sampling.cfg_scale: {job.decode.sampling.cfg_scale} must be 1 for captioning (no classifier-free guidance)")
    if method != "ar":
        try:
            draft_path = resolve_draft_path(job.model, method, job.decode.draft_model, s3=job.input.s3, files="config")
        except ValueError as exc:
            raise ModelNotFoundError(str(exc)) from None
        if not (draft_path / CONFIG_NAME).is_file():
            raise ModelNotFoundError(f"decode.draft_model: no {method} draft at {draft_path} ({CONFIG_NAME} missing)")
        from transformers import AutoConfig

        try:
            draft_config = json.loads((draft_path / CONFIG_NAME).read_text())
        except (OSError, ValueError) as exc:
            raise ModelNotFoundError(f"decode.draft_model: cannot read {draft_path / CONFIG_NAME}: {exc}") from None
        text_config = AutoConfig.from_pretrained(str(path), local_files_only=True).get_text_config()
        check_draft_fits(draft_path, draft_config, text_config, method)


def _check_t2i_model(job: JobConfig) -> None:
    """A text-to-image checkpoint of a supported family, its VQ-GAN and the image size it is asked for."""
    size = parse_image_size(job.size)
    try:
        path = resolve_t2i_path(job.model, s3=job.input.s3, files="config")
        model_type = checkpoint_model_type(path)
    except ModelSourceError as exc:
        raise ModelNotFoundError(str(exc)) from None
    except (FileNotFoundError, ValueError) as exc:
        hint = " (train it: python -m raydec.reference.train t2i)" if job.model == REFERENCE_NAME else ""
        raise ModelNotFoundError(f"model: {job.model!r}: {exc}{hint}") from None
    if model_type not in T2I_LOADERS:
        raise ModelNotFoundError(
            f"model: {job.model!r} is a {model_type!r} checkpoint; text-to-image supports {sorted(T2I_LOADERS)}"
        )
    check_vqgan_path(path, job.vqgan_path, s3=job.input.s3)
    if size is not None:
        problem = t2i_size_problem(path, *size, job.vqgan_path, s3=job.input.s3)
        if problem is not None:
            raise ValueError(f"{problem} (model {job.model!r})")
    if "max_new_tokens" in job.decode.model_fields_set:
        raise ValueError(
            f"decode.max_new_tokens: {job.decode.max_new_tokens} set, but an image's length is the model's image layout; "
            "leave it unset in text-to-image jobs"
        )


def preflight(job: JobConfig) -> List[InputFile]:
    """Fail fast before any model loads: task supported, input columns present, checkpoint
    present and fit for the task (``check_inputs``), output writable and what it holds from
    earlier runs made by the same job (``check_output``). Returns the input files."""
    files = check_inputs(job)
    output, _, _ = check_output(job)
    logger.info("preflight ok: %d input file(s), output %s writable, model %s", len(files), output.uri, job.model)
    return files


def check_inputs(job: JobConfig) -> List[InputFile]:
    """The input files, once the task is supported, their columns present and the checkpoint
    present and fit for the task (``check_model``)."""
    if job.task not in ROW_DECODERS:
        raise ValueError(f"task: {job.task!r} is not available in this build (available: {sorted(ROW_DECODERS)})")
    files = check_dataset(job.input, job.task)
    check_model(job)
    return files


def storage_for_workers(job: JobConfig) -> JobConfig:
    """The job as its workers get it: S3 endpoint, region and credentials resolved here, from
    the config and this driver's environment (AWS_*), so workers on other nodes or in a submitted
    job's runtime env use what the preflight listing used. The manifest keeps the unresolved
    config (and redacts secrets)."""
    return job.model_copy(update={
        "input": job.input.model_copy(update={"s3": job.input.s3.resolved()}),
        "output": job.output.model_copy(update={"s3": job.output.s3.resolved()}),
    })


def _remote_args(
    job: JobConfig, cluster_gpus: float, node_gpus: Optional[float] = None, cluster_cpus: Optional[float] = None,
) -> Dict[str, Any]:
    """Resources and fault tolerance of the pool's actors.

    GPUs requested on a cluster without any fall back to CPU actors (with a warning) rather
    than waiting forever for a GPU that will not come; so does nothing else: a request no node
    can hold (``node_gpus``: the most GPUs of any one node) is an error, a pool the cluster can
    only partly hold a warning.
    """
    pool = job.pool
    args: Dict[str, Any] = dict(
        num_cpus=pool.cpus_per_worker, max_restarts=pool.max_restarts, max_task_retries=pool.max_task_retries,
    )
    node_gpus = cluster_gpus if node_gpus is None else node_gpus
    if pool.gpus_per_worker > 0 and cluster_gpus > 0:
        if pool.gpus_per_worker > node_gpus:
            raise IOConfigError(
                f"pool.gpus_per_worker={pool.gpus_per_worker}: no node of the Ray cluster has more than "
                f"{node_gpus:g} GPU(s), so no actor could ever start"
            )
        fit = int(cluster_gpus // pool.gpus_per_worker)
        if fit < pool.workers:
            logger.warning(
                "pool.workers=%d x gpus_per_worker=%s needs %g GPU(s); the cluster has %g: %d actor(s) run, "
                "the rest wait for GPUs", pool.workers, pool.gpus_per_worker,
                pool.workers * pool.gpus_per_worker, cluster_gpus, fit,
            )
        args["num_gpus"] = pool.gpus_per_worker
    elif pool.gpus_per_worker > 0:
        logger.warning("pool.gpus_per_worker=%s but the Ray cluster has no GPU: running on CPU", pool.gpus_per_worker)
    if cluster_cpus is not None and cluster_cpus - pool.workers * pool.cpus_per_worker < 1:
        logger.warning(
            "pool.workers=%d x cpus_per_worker=%s leaves less than one of the cluster's %g CPU(s) free: the step that "
            "cuts the read rows into batches needs one, so the job may wait for ever; lower cpus_per_worker",
            pool.workers, pool.cpus_per_worker, cluster_cpus,
        )
    return args


def _cluster_resources() -> tuple[float, float, float]:
    """(GPUs in the cluster, the most GPUs of any one alive node, CPUs in the cluster)."""
    import ray

    per_node = [float(n.get("Resources", {}).get("GPU", 0.0)) for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    return float(total.get("GPU", 0.0)), max(per_node, default=0.0), float(total.get("CPU", 0.0))


def _warn_if_output_is_node_local(job: JobConfig, output: OutputLocation) -> None:
    """A local output on a multi-node cluster is only one output if every node mounts it."""
    import ray

    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if nodes > 1 and not output.is_s3:
        logger.warning(
            "output.path %s is a local path on a %d-node cluster: every node writes where it runs, so unless "
            "that path is a filesystem all nodes share, results end up split (use s3:// or shared storage)",
            job.output.path, nodes,
        )


def _pool_strategy(job: JobConfig, rows: int) -> Any:
    """A fixed pool of pool.workers actors, or an autoscaling one from pool.min_workers; never
    more actors than batches."""
    import ray.data

    most = max(1, min(job.pool.workers, math.ceil(rows / job.pool.batch_size)))
    if job.pool.min_workers is None:
        return ray.data.ActorPoolStrategy(size=most)
    return ray.data.ActorPoolStrategy(min_size=min(job.pool.min_workers, most), max_size=most)


def _scan(job: JobConfig, fragments: List[Fragment], include_errors: bool) -> Tuple[IdScan, Any]:
    """Scan the input's and the output's ids in a Ray task (not here: the driver holds no ids).

    Returns the scan and an object ref to {fragment index: done ids} of the fragments a resume
    finds partly done (None when there are none). A duplicate id raises DuplicateIdError here.
    """
    import ray

    task = ray.remote(scan_ids).options(num_cpus=READ_TASK_CPUS, num_returns=2, max_retries=2)
    scan_ref, partial_ref = task.remote(fragments, job.input, job.task, job.output, include_errors)
    try:
        scan = ray.get(scan_ref)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, ValueError):  # a duplicate id, an unreadable input: its own one line
            raise exc.cause from None
        raise
    partly_done = any(0 < done < rows for rows, done in zip(scan.rows, scan.done))
    return scan, partial_ref if partly_done else None


class _Progress:
    """Counts the pool's per-row summaries and logs rows/s and ETA at most every PROGRESS_EVERY_S."""

    def __init__(self, report: JobReport, total: int, job_started: float) -> None:
        self.report, self.total, self.job_started = report, total, job_started
        self.started = self.logged = time.perf_counter()
        self.seen = 0  # rows through the pool this run, invalid ones included

    def add(self, batch: Any) -> None:
        report = self.report
        first = self.seen == 0
        if first:
            report.timings["first_row_s"] = time.perf_counter() - self.job_started
        invalid = batch["invalid"].to_pylist()
        bad = sum(invalid)  # rows that failed validation in a read task: error rows, not decoded
        report.validation_errors += bad
        report.processed += batch.num_rows - bad
        report.processing_errors += batch.num_rows - batch["error"].null_count - bad
        for worker, node, skipped in zip(batch["worker"].to_pylist(), batch["node"].to_pylist(), invalid):
            if not skipped:
                report.per_worker[worker] = report.per_worker.get(worker, 0) + 1
                report.per_node[node] = report.per_node.get(node, 0) + 1
        self.seen += batch.num_rows
        now = time.perf_counter()
        if first or now - self.logged >= PROGRESS_EVERY_S or self.seen >= self.total:
            self.logged = now
            elapsed = now - self.started
            rate = self.seen / elapsed if elapsed > 0 else 0.0
            left = max(0, self.total - self.seen)
            eta = f"{left / rate:.0f} s" if rate > 0 else "unknown"
            logger.info("progress: %d / %d row(s) done, %.2f rows/s, ETA %s", self.seen, self.total, rate, eta)


def _run_pool(
    job: JobConfig, fragments: List[Fragment], scan: IdScan, partial_ref: Any, report: JobReport, job_started: float,
) -> None:
    """Read the fragments with rows left (read tasks), decode them in the actor pool (which writes
    the results), and consume the pool's per-row summaries for progress and counts."""
    todo = scan.todo
    total = scan.input_rows - sum(scan.done)
    total = total if job.max_rows is None else min(total, job.max_rows)
    if not todo:
        return
    with warnings.catch_warnings():
        # Ray 2.60 has no named parameters for max_restarts / max_task_retries yet; the
        # **ray_remote_args route is the documented one for actor fault tolerance.
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        dataset = read_dataset(job, fragments, todo, partial_ref)
        if job.max_rows is not None:
            dataset = dataset.limit(job.max_rows)  # streaming: reads stop once enough rows passed
        dataset = dataset.map_batches(
            GenerationWorker,
            fn_constructor_kwargs={"job": job},
            batch_size=job.pool.batch_size,
            batch_format="pyarrow",
            compute=_pool_strategy(job, total),
            **_remote_args(job, *_cluster_resources()),
        )
    progress = _Progress(report, total, job_started)
    for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
        progress.add(batch)
    report.workers_seen = len(report.per_worker)


def run_job(job: JobConfig, files: Optional[List[InputFile]] = None) -> JobReport:
    """Run `job` on the current Ray cluster (connecting if needed) and return its report.

    The driver reads Parquet footers and counts; rows, ids and images stay in Ray tasks and the
    object store. Raises JobIncompleteError if some input id has no result at the end (after
    writing the manifest, so the gap is on record). ``files``: the input files ``preflight`` listed
    (the input and the model are then not checked again); the output is checked here either way,
    right before it is used (``check_output``).
    """
    started = time.perf_counter()
    files = files if files is not None else check_inputs(job)
    output, earlier, weights = check_output(job)  # the manifest and results of earlier runs, read once
    report = JobReport(output=output.uri)
    fragments = plan_fragments(files, job.input)
    connect_ray()  # no-op when Ray is up; else RAY_ADDRESS, else a local cluster
    _warn_if_output_is_node_local(job, output)
    workers_job = storage_for_workers(job)
    scan, partial_ref = _scan(workers_job, fragments, include_errors=not job.retry_errors)
    report.input_rows = scan.input_rows
    report.skipped_completed = sum(scan.done)
    logger.info(
        "job: %d row(s) in %d fragment(s), %d already done, %d to decode on %d worker(s); results go to %s",
        scan.input_rows, len(fragments), report.skipped_completed, scan.input_rows - report.skipped_completed,
        job.pool.workers, report.output,
    )
    workers_job, plan = plan_job(workers_job, fragments, _remote_args(job, *_cluster_resources()), earlier)  # once, for every worker
    report.plan = plan.record()
    report.timings["prepare_s"] = time.perf_counter() - started
    # on record before any row is written, so an interrupted job's output still names its job
    # (and the plan it decodes with) and a resume with another config is refused
    _manifest(output, job, report, weights, status="running")
    generate_started = time.perf_counter()
    _run_pool(workers_job, fragments, scan, partial_ref, report, started)
    report.timings["generate_s"] = time.perf_counter() - generate_started
    _verify(workers_job, fragments, report)
    if report.processed and report.processing_errors == report.processed:
        logger.warning("every one of the %d row(s) this run decoded failed: see the worker logs", report.processed)
    report.timings["total_s"] = time.perf_counter() - started
    _manifest(output, job, report, weights, status="complete" if report.complete else "incomplete")
    stopped_by_max_rows = job.max_rows is not None and report.processed + report.validation_errors >= job.max_rows
    if not report.complete and stopped_by_max_rows:
        logger.info("stopped after max_rows=%d row(s); %d row(s) left: re-run without max_rows to finish",
                    job.max_rows, report.missing)
    elif not report.complete:
        raise JobIncompleteError(
            f"job incomplete: {report.missing} input id(s) have no result, e.g. {report.missing_ids[:5]}; "
            f"re-run to resume"
        )
    return report


def _verify(job: JobConfig, fragments: List[Fragment], report: JobReport) -> None:
    """Count results for this input (in a Ray task): exactly one per id, or the missing ids."""
    scan, _ = _scan(job, fragments, include_errors=True)
    report.results = scan.results
    report.result_errors = scan.result_errors
    report.missing = scan.missing
    report.missing_ids = scan.missing_sample


def _manifest(output: OutputLocation, job: JobConfig, report: JobReport, weights: Dict[str, str], status: str) -> str:
    """Write the manifest with `status` (running | complete | incomplete), the weights' fingerprints
    (`job_weights`), counts, timings and speed."""
    generate_s = report.timings.get("generate_s", 0.0)
    extra = {
        "method": job.decode.method,
        "task": job.task,
        "model": job.model,
        "workers": job.pool.workers,
        "rows_per_s": report.processed / generate_s if generate_s > 0 and report.processed else None,
        "missing_ids": report.missing_ids[:100],
        "rows_per_worker": dict(sorted(report.per_worker.items())),
        "rows_per_node": dict(sorted(report.per_node.items())),
        "weights": weights,
        "models": job_models(job),
        "status": status,
    }
    if report.plan is not None:  # what the rows are decoded with, and where each part came from
        extra["plan"] = report.plan
    uri = output.write_manifest(job, report.counts(), report.timings, extra)
    logger.info("manifest written to %s", uri)
    return uri
