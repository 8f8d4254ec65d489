"""The decode plan of a batch job, a stage and a Serve replica: made once, before any row is
decoded, by ``raydec.api.plan.plan_decode``, where a worker decodes.

    workers_job, plan = plan_job(job, fragments, remote_args)   # the driver, before the pool starts
    config, plan = plan_stage(config, dataset)                  # build_processor's stage, before its actors start
    config, plan = plan_replica(config)                         # a Serve replica's constructor, where its model runs

With sampling, a row's sample depends on the draft shape it is decoded with, so every worker of a
job decodes with one plan, and a resumed job with the plan its manifest records (``recorded_plan``).
What a config leaves to "auto" (``pool.batch_size``, ``decode.jacobi`` / ``draft_tree``) is chosen on
calibration rows (:class:`RowsCalibration`) in a Ray task with a worker's resources (on its device,
so the timings are that device's): a job's input's first rows, a stage's dataset's first rows, or
rows a replica makes (``raydec.runtime.calibration``). A choice already cached for the same weights,
device, dtype and batch is taken without decoding; the cache is the worker node's
``~/.cache/raydec/shapes``, or ``$RAYDEC_CACHE_DIR/shapes`` when the driver sets it. The manifest
keeps the plan under ``plan`` (the job's own config keeps "auto"), and so do the logs.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Dict, List, Tuple

import torch

from raydec.api import DEFAULT_CAPTION_PROMPT, draft_dtype, load_draft_model, sized
from raydec.api.draft_shapes import ShapeCache, target_shape_key
from raydec.api.inputs import caption_decode_config, image_decode_config
from raydec.api.memory import kv_bytes_per_row, largest_batch, module_bytes, worker_memory_bytes
from raydec.api.plan import DecodePlan, plan_decode, settled_plan
from raydec.api.schedulers import CaptionScheduler, ImageScheduler
from raydec.api.tuner import CALIBRATION_ROWS, calibration_pool_size, round_size
from raydec.config import DRAFT_METHODS, DecodeConfig, JacobiDraftConfig
from raydec.io import attach_caption_images, validate_caption_rows, validate_t2i_rows
from raydec.io.fragments import Fragment, read_fragment
from raydec.io.storage import EarlierOutput
from raydec.models.registry import resolve_draft_path
from raydec.runtime.calibration import builtin_calibration_rows
from raydec.runtime.config import JobConfig, ProcessorConfig
from raydec.runtime.row_decoders import make_row_decoder, worker_device
from raydec.speculative.capture import resolve_compile

logger = logging.getLogger(__name__)

Rows = List[Dict[str, Any]]
AUTO_BATCH_ROWS = 32  # a stage whose batch size is "auto" takes calibration rows for a batch of this many to the driver


class RowsCalibration:
    """Calibration on validated, error-free rows ``fetch(count)`` gives (at most ``count``; raises when
    there is none): a row decoder per candidate, as a worker decodes, on this process's device."""

    def __init__(self, config: ProcessorConfig, fetch: Callable[[int], Rows]) -> None:
        self.config, self.fetch = config, fetch
        self.rows: Rows = []
        self._probe: Any = None

    def probe(self) -> Any:
        """A loaded row decoder (its model cached for the candidates) and the threads set."""
        if self._probe is None:
            ar = self.config.decode.model_copy(update={"method": "ar", "jacobi": JacobiDraftConfig(), "draft_tree": None})
            self._probe = make_row_decoder(self.config.model_copy(update={"decode": ar, "batch_size": 1}))
            self._probe.setup()
        return self._probe

    @property
    def captured(self) -> bool:
        return resolve_compile(self.config.decode.compile, self.probe().target.device)

    def available(self, batch: int) -> int:
        self.rows = self.fetch(calibration_pool_size(round_size(batch)))
        return len(self.rows)

    def key(self, decode: DecodeConfig, batch: int) -> dict | None:
        return shape_cache_key(self.config.model_copy(update={"decode": decode, "batch_size": batch}), self.probe().target)

    def seconds(self, decode: DecodeConfig, batch: int, rows: list[int]) -> float:
        decoder = make_row_decoder(self.config.model_copy(update={"decode": decode, "batch_size": batch}))
        decoder.setup()
        start = time.perf_counter()
        failed = [r for r in decoder([self.rows[i] for i in rows]) if r.get("error")]  # a row's own fault: alike for every candidate
        if failed:
            logger.warning("calibration: %d of %d row(s) failed with %s (e.g. %s)", len(failed), len(rows), decode.method, failed[0]["error"])
        return time.perf_counter() - start

    def measure_batch(self) -> dict:
        return choose_batch_on_rows(self.config, self.fetch(CALIBRATION_ROWS))


def shape_cache_key(config: ProcessorConfig, target: Any) -> Dict[str, Any] | None:
    """The shape cache's key for ``config`` decoding on ``target`` (loaded, at the config's image
    size) in this process (its torch threads): the key ``generate_images`` / ``caption_images``
    use for the same decode config, weights, device, dtype and batch
    (``raydec.api.draft_shapes.target_shape_key``)."""
    decode = config.decode
    if config.task == "t2i":
        return target_shape_key(image_decode_config(decode, target), target, config.batch_size)
    draft_folder = (resolve_draft_path(config.model, decode.method, decode.draft_model, s3=config.rows.s3, files="config")
                    if decode.method in DRAFT_METHODS else None)
    return target_shape_key(caption_decode_config(decode, target), target, config.batch_size, draft_folder)


def calibration_rows(job: JobConfig, fragments: List[Fragment], count: int) -> List[Dict[str, Any]]:
    """Up to ``count`` good (validated, error-free) rows from the start of the input."""
    rows: List[Dict[str, Any]] = []
    for fragment in fragments:
        for chunk in read_fragment(fragment, job.input, job.task, batch_rows=max(count, 16)):
            rows += [row for row in chunk if not row.get("error")]
            if len(rows) >= count:
                return rows[:count]
    return rows


def choose_batch_on_rows(config: ProcessorConfig, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``config``'s batch size for "auto" (``raydec.api.memory.largest_batch``), measured where a worker
    runs: a row's KV cache from admitting ``rows`` (validated, error-free) together, the weights, the
    worker's memory, and the fastest batch the shape cache knows for this model on this device.
    Returns the record a manifest keeps (``batch_size`` and the figures it came from)."""
    started = time.perf_counter()
    torch.set_num_threads(config.threads)
    device, dtype = worker_device(config), getattr(torch, config.dtype)
    ar = config.decode.model_copy(update={"method": "ar", "jacobi": JacobiDraftConfig(), "draft_tree": None})  # the shape is not chosen yet
    draft_model = None
    if config.task == "t2i":
        scheduler: Any = ImageScheduler(config.model, ar, dtype=dtype, device=device, batch_size=len(rows), vqgan_path=config.vqgan_path,
                                        s3=config.rows.s3)
        for row in rows:
            scheduler.submit(row["prompt"], int(row["seed"]), negative_prompt=row.get("negative_prompt"), size=config.size)
    else:
        scheduler = CaptionScheduler(config.model, ar, dtype=dtype, device=device, batch_size=len(rows), s3=config.rows.s3)
        for row in attach_caption_images(rows, config.rows.s3, max_pixels=config.rows.max_image_pixels):
            if not row.get("error"):
                text = row.get("prompt") or DEFAULT_CAPTION_PROMPT
                scheduler.submit([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}], [row["pil_image"]],
                                 int(row["seed"]))
        if config.decode.method in DRAFT_METHODS:
            draft_model = load_draft_model(scheduler.target, config.decode.method, config.model, config.decode.draft_model,
                                           dtype=draft_dtype(scheduler.target, config.decode.draft_dtype), s3=config.rows.s3)
    if not scheduler.sessions:
        raise ValueError("batch_size='auto': no calibration row could be read to measure a row's memory on")
    (session,) = scheduler.sessions.values()
    try:
        kv = kv_bytes_per_row(session)
    finally:
        scheduler.drop()
    target = scheduler.target
    weights = module_bytes(target.model, draft_model)
    share = config.gpus_per_worker if torch.device(target.device).type == "cuda" else 1.0
    memory = worker_memory_bytes(target.device, weights, share)
    key = shape_cache_key(config, sized(target, config.size) if config.task == "t2i" else target)
    best = ShapeCache().best_batch(key) if key is not None else None
    batch = largest_batch(memory, weights, kv, config.max_memory_fraction, best)
    return {"batch_size": batch, "kv_bytes_per_row": kv, "weights_bytes": weights, "memory_bytes": memory,
            "max_memory_fraction": config.max_memory_fraction, "best_batch": best, "calibration_rows": len(rows),
            "seconds": time.perf_counter() - started}


def remote_tuning(function: Any, num_cpus: float, num_gpus: float) -> Any:
    """``function`` as a Ray task with a worker's resources (and the driver's shape cache folder, when it sets one)."""
    import ray

    options: Dict[str, Any] = dict(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0)
    if os.environ.get("RAYDEC_CACHE_DIR"):  # the driver's shape cache, where the task runs too
        options["runtime_env"] = {"env_vars": {"RAYDEC_CACHE_DIR": os.environ["RAYDEC_CACHE_DIR"]}}
    return ray.remote(function).options(**options)


def recorded_plan(job: JobConfig, output: EarlierOutput) -> Dict[str, Any]:
    """What the manifest in ``job``'s output records of its plan, for ``plan_decode``'s ``recorded``:
    its batch size and shape once rows were written with them (they fix them), else its shape only
    when it was chosen for the same batch size. A manifest of an earlier release keeps them under
    ``shape`` and ``batch_size``."""
    manifest = output.manifest or {}
    plan = manifest.get("plan")
    if not isinstance(plan, dict):  # an earlier release's records
        shape, batch = manifest.get("shape"), manifest.get("batch_size")
        plan = {**shape, "batch_size": shape.get("batch")} if isinstance(shape, dict) and "method" in shape else {}
        if isinstance(batch, dict) and isinstance(batch.get("batch_size"), int):
            plan["batch_size"] = batch["batch_size"]
    if "method" not in plan or not isinstance(plan.get("batch_size"), int):
        return {}
    if output.has_results:
        return plan
    return {k: v for k, v in plan.items() if k != "batch_size"} if plan["batch_size"] == job.pool.batch_size else {}


def plan_in_worker(config: ProcessorConfig, fetch: Callable[[int], Rows], recorded: Dict[str, Any]) -> DecodePlan:
    """``config``'s plan, chosen where a worker runs (a Ray task, or a replica) on the rows ``fetch`` gives."""
    torch.set_num_threads(config.threads)
    return plan_decode(config.decode, config.batch_size, RowsCalibration(config, fetch), recorded)


def job_rows(job: JobConfig, fragments: List[Fragment]) -> Callable[[int], Rows]:
    """A job's calibration rows: the first valid ones of its input."""
    def fetch(count: int) -> Rows:
        rows = calibration_rows(job, fragments, count)
        if not rows:
            raise ValueError(f"input.path {job.input.path!r} has no valid row to choose the 'auto' batch size or draft shape on")
        return rows
    return fetch


def plan_job(
    job: JobConfig, fragments: List[Fragment], remote_args: Dict[str, Any], output: EarlierOutput,
) -> Tuple[JobConfig, DecodePlan]:
    """(the job as its workers decode it, its plan). A re-run takes what its output's manifest records
    (``output``: what the output held before this run); what is left to "auto" is chosen in a Ray task
    with a worker's resources."""
    import ray

    recorded = recorded_plan(job, output)
    plan = settled_plan(job.decode, job.pool.batch_size, recorded)  # the driver measures nothing
    if plan is None:  # something left to "auto": measured where a worker runs
        task = remote_tuning(plan_job_in_worker, remote_args.get("num_cpus", 1), remote_args.get("num_gpus", 0))
        plan = ray.get(task.remote(job, fragments, recorded))
    log_plan(plan)
    pool = job.pool.model_copy(update={"batch_size": plan.batch_size})
    return job.model_copy(update={"decode": plan.decode, "pool": pool}), plan


def plan_job_in_worker(job: JobConfig, fragments: List[Fragment], recorded: Dict[str, Any]) -> DecodePlan:
    return plan_in_worker(job.processor_config(), job_rows(job, fragments), recorded)


def plan_stage(config: ProcessorConfig, dataset: Any) -> Tuple[ProcessorConfig, DecodePlan]:
    """``build_processor``'s stage with its plan made once, before its actors start (on the dataset's
    first rows, validated as the stage validates them, in a Ray task with an actor's resources):
    every actor of the stage decodes with it."""
    if config.decode.auto_shape or config.batch_size == "auto":
        import ray

        validate = validate_t2i_rows if config.task == "t2i" else validate_caption_rows

        def first_rows(count: int) -> Rows:
            first = dataset.limit(count * 4).take(count * 4)  # a few rows to the driver: bad ones are skipped
            rows = [row for row in validate(first, config.rows, file_key="calibration", first_row_index=0) if not row["error"]][:count]
            if not rows:
                raise ValueError("the dataset's first rows hold no valid row to choose the 'auto' batch size or draft shape on")
            return rows

        # the rows go to the driver, so an "auto" batch tunes on as many as a batch of AUTO_BATCH_ROWS would
        rows = first_rows(calibration_pool_size(round_size(AUTO_BATCH_ROWS if config.batch_size == "auto" else config.batch_size)))
        task = remote_tuning(plan_in_worker, config.cpus_per_worker, config.gpus_per_worker)
        plan = ray.get(task.remote(config, lambda count: rows[:count], {}))
    else:
        plan = plan_decode(config.decode, config.batch_size)
    log_plan(plan)
    return config.model_copy(update={"decode": plan.decode, "batch_size": plan.batch_size}), plan


def plan_replica(config: ProcessorConfig) -> DecodePlan:
    """A Serve replica's plan, made in its constructor where its model runs, on rows it makes itself."""
    plan = plan_in_worker(config, lambda count: builtin_calibration_rows(config.task, count, config.rows), {})
    log_plan(plan)
    return plan


def plan_replica_buckets(config: ProcessorConfig, plan: DecodePlan, buckets: List[int]) -> Dict[int, DecodePlan]:
    """A Serve replica that follows its live batch: a plan per batch bucket in ``buckets``, each as
    ``plan_replica`` makes one (from the shape cache, else tuned now on rows the replica makes, and
    cached) for that batch size; ``plan`` (the replica's own, ``plan_replica``'s) is its batch size's."""
    fetch = lambda count: builtin_calibration_rows(config.task, count, config.rows)  # noqa: E731
    plans: Dict[int, DecodePlan] = {}
    for bucket in buckets:
        plans[bucket] = plan if bucket == plan.batch_size else plan_in_worker(config.model_copy(update={"batch_size": bucket}), fetch, {})
        logger.info("decode plan of batch bucket %d: %s", bucket, describe_plan(plans[bucket]))
    return plans


def describe_plan(plan: DecodePlan) -> str:
    """One line: the batch size and what rows decode with, and where each came from."""
    batch = f"batch_size {plan.batch_size}"
    if plan.batch_from == "measured":
        figures = plan.batch
        batch += (f" (auto: a row's KV cache {figures['kv_bytes_per_row'] / 2**20:.1f} MiB, {100 * figures['max_memory_fraction']:.0f}% of "
                  f"{figures['memory_bytes'] / 2**30:.2f} GiB"
                  + (f"; at most {figures['best_batch']}, the batch the shape cache shows fastest" if figures.get("best_batch") else "") + ")")
    elif plan.batch_from == "manifest":
        batch += " (auto: as the output's manifest records)"
    how = {"config": "", "default": " (the method's default shape)", "cache": " (auto: from the shape cache)",
           "manifest": " (auto: as the output's manifest records)"}.get(plan.shape_from)
    if how is None:  # tuned now
        how = f" (auto: tuned in {plan.shape['seconds']:.0f} s on {plan.shape['calibration_rows']} rows, {plan.shape['ratio_to_ar']:.2f}x AR; cached)"
    return f"{batch}, {plan.label}{how}"


def log_plan(plan: DecodePlan) -> None:
    logger.info("decode plan: %s", describe_plan(plan))
