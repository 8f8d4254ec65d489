"""A batch job's draft shape and batch size when its config says "auto": chosen once, before any
row is decoded.

    job, shape, batch = resolve_job_auto(job, fragments, remote_args)   # the driver, before the pool starts

With sampling, a row's sample depends on the shape it is decoded with, so every worker of a job
must decode with the same one, and a resumed job with the one it started with. The driver
therefore settles it before the pool starts:

1. the manifest already in the output records one (a re-run of a killed or partial job): reuse it;
2. else one Ray task with a worker's resources (on its device, so the timings are that device's)
   reads a few calibration rows from the start of the input, loads the model and chooses
   (``raydec.api.frontier.resolve_shape``; a choice already cached for the same weights, device,
   dtype and batch is taken without decoding; the cache is the worker node's
   ``~/.cache/raydec/shapes``, or ``$RAYDEC_CACHE_DIR/shapes`` when the driver sets it);

and the workers receive the job with the concrete shape. The manifest records it under
``shape`` (and the job's own config keeps "auto"), and so do the logs.

``pool.batch_size: auto`` is settled first, the same way (the manifest's ``batch_size`` record once
rows were written, else in that Ray task): the most rows whose KV cache, measured by admitting a
few calibration rows, fits ``pool.max_memory_fraction`` of the worker's memory beside the weights
(``raydec.api.memory.largest_batch``), at most the batch the shape cache shows decoded fastest for
this model on this device. The shape is then chosen for that batch. A Serve replica makes both
choices at its start with the same functions, on rows it makes itself (``raydec.runtime.calibration``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from raydec.config import JACOBI_METHODS
from raydec.io import read_manifest
from raydec.io.writers import shard_uris
from raydec.io.fragments import Fragment, read_fragment
from raydec.runtime.config import JobConfig, ProcessorConfig

logger = logging.getLogger(__name__)


def recorded_shape(job: JobConfig) -> Optional[Dict[str, Any]]:
    """The shape the manifest in ``job``'s output records: always once rows were written with it
    (they fix it, whatever the batch size now), else only for the same batch size."""
    try:
        manifest = read_manifest(job.output)
    except (OSError, KeyError, ValueError):
        return None
    shape = manifest.get("shape")
    if not isinstance(shape, dict) or "method" not in shape:
        return None
    if shape.get("batch") != job.pool.batch_size and not shard_uris(job.output):
        return None
    return shape


def calibration_rows(job: JobConfig, fragments: List[Fragment], count: int) -> List[Dict[str, Any]]:
    """Up to ``count`` good (validated, error-free) rows from the start of the input."""
    rows: List[Dict[str, Any]] = []
    for fragment in fragments:
        for chunk in read_fragment(fragment, job.input, job.task, batch_rows=max(count, 16)):
            rows += [row for row in chunk if not row.get("error")]
            if len(rows) >= count:
                return rows[:count]
    return rows


def tune_in_worker(job: JobConfig, fragments: List[Fragment]) -> Dict[str, Any]:
    """What ``job`` leaves to "auto", chosen where a worker would run (a Ray task) on the input's first
    rows: {"batch": the batch size record} when pool.batch_size is "auto", {"shape": the shape record}
    when the draft shape is."""
    from raydec.api.tuner import CALIBRATION_ROWS, calibration_pool_size, round_size

    config, chosen = job.processor_config(), {}
    if config.batch_size == "auto":
        rows = calibration_rows(job, fragments, CALIBRATION_ROWS)
        if not rows:
            raise ValueError(f"pool.batch_size='auto': input.path {job.input.path!r} has no valid row to measure a row's memory on")
        chosen["batch"] = choose_batch_on_rows(config, rows)
        config = config.model_copy(update={"batch_size": chosen["batch"]["batch_size"]})
    if config.decode.auto_shape:
        rows = calibration_rows(job, fragments, calibration_pool_size(round_size(config.batch_size)))
        if not rows:
            raise ValueError(f"decode.jacobi='auto': input.path {job.input.path!r} has no valid row to tune the draft shape on")
        chosen["shape"] = tune_on_rows(config, rows)
    return chosen


def shape_cache_key(config: ProcessorConfig, target: Any) -> Dict[str, Any] | None:
    """The shape cache's key for ``config`` decoding on ``target`` (loaded, at the config's image
    size) in this process (its torch threads): the key ``generate_images`` / ``caption_images``
    use for the same decode config, weights, device, dtype and batch
    (``raydec.api.frontier.target_shape_key``)."""
    from raydec.api.frontier import target_shape_key
    from raydec.api.inputs import caption_decode_config, image_decode_config
    from raydec.config import DRAFT_METHODS
    from raydec.models.registry import resolve_draft_path

    decode = config.decode
    if config.task == "t2i":
        return target_shape_key(image_decode_config(decode, target), target, config.batch_size)
    draft = resolve_draft_path(config.model, decode.method, decode.draft_model) if decode.method in DRAFT_METHODS else None
    return target_shape_key(caption_decode_config(decode, target), target, config.batch_size, draft)


def choose_batch_on_rows(config: ProcessorConfig, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``config``'s batch size for "auto" (``raydec.api.memory.largest_batch``), measured where a worker
    runs: a row's KV cache from admitting ``rows`` (validated, error-free) together, the weights, the
    worker's memory, and the fastest batch the shape cache knows for this model on this device.
    Returns the record a manifest keeps (``batch_size`` and the figures it came from)."""
    import torch

    from raydec.api import DEFAULT_CAPTION_PROMPT, draft_dtype, load_draft, sized
    from raydec.api.frontier import ShapeCache
    from raydec.api.memory import kv_bytes_per_row, largest_batch, module_bytes, worker_memory_bytes
    from raydec.api.schedulers import CaptionScheduler, ImageScheduler
    from raydec.config import DRAFT_METHODS, JacobiDraftConfig
    from raydec.io import attach_caption_images
    from raydec.runtime.row_decoders import worker_device

    started = time.perf_counter()
    torch.set_num_threads(config.threads)
    device, dtype = worker_device(config), getattr(torch, config.dtype)
    ar = config.decode.model_copy(update={"method": "ar", "jacobi": JacobiDraftConfig(), "draft_tree": None})  # the shape is not chosen yet
    draft = None
    if config.task == "t2i":
        scheduler: Any = ImageScheduler(config.model, ar, dtype=dtype, device=device, batch_size=len(rows), vqgan_path=config.vqgan_path)
        for row in rows:
            scheduler.submit(row["prompt"], int(row["seed"]), negative_prompt=row.get("negative_prompt"), size=config.size)
    else:
        scheduler = CaptionScheduler(config.model, ar, dtype=dtype, device=device, batch_size=len(rows))
        for row in attach_caption_images(rows, config.rows.s3, max_pixels=config.rows.max_image_pixels):
            if not row.get("error"):
                text = row.get("prompt") or DEFAULT_CAPTION_PROMPT
                scheduler.submit([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}], [row["pil_image"]],
                                 int(row["seed"]))
        if config.decode.method in DRAFT_METHODS:
            draft = load_draft(scheduler.target, config.decode.method, config.model, config.decode.draft_model,
                               dtype=draft_dtype(scheduler.target, config.decode.draft_dtype))
    if not scheduler.sessions:
        raise ValueError("batch_size='auto': no calibration row could be read to measure a row's memory on")
    (session,) = scheduler.sessions.values()
    try:
        kv = kv_bytes_per_row(session)
    finally:
        scheduler.drop()
    target = scheduler.target
    weights = module_bytes(target.model, draft)
    share = config.gpus_per_worker if torch.device(target.device).type == "cuda" else 1.0
    memory = worker_memory_bytes(target.device, weights, share)
    key = shape_cache_key(config, sized(target, config.size) if config.task == "t2i" else target)
    best = ShapeCache().best_batch(key) if key is not None else None
    batch = largest_batch(memory, weights, kv, config.max_memory_fraction, best)
    return {"batch_size": batch, "kv_bytes_per_row": kv, "weights_bytes": weights, "memory_bytes": memory,
            "max_memory_fraction": config.max_memory_fraction, "best_batch": best, "calibration_rows": len(rows),
            "seconds": time.perf_counter() - started}


def tune_on_rows(config: ProcessorConfig, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The record of ``raydec.api.frontier.resolve_shape`` for ``config``'s auto shape at its batch
    size, calibrated on ``rows`` (validated, error-free; each round takes the next
    ``round_size(batch)`` of them, ``round_rows``, in parts of one batch, ``round_parts``), with the
    batch size and the seconds it took."""
    from raydec.api.frontier import ShapeCache, resolve_shape
    from raydec.api.tuner import round_parts, round_rows, round_size
    from raydec.speculative.capture import resolve_compile
    from raydec.runtime.row_decoders import make_row_decoder

    started = time.perf_counter()
    probe = make_row_decoder(config.model_copy(update={"decode": config.decode.model_copy(update={"method": "ar"})}))
    probe.setup()  # loads the model (cached for the candidates below) and sets the threads
    key = shape_cache_key(config, probe.target)  # the row decoder's target makes the config's image size

    parts, per_part = round_parts(config.batch_size, min(len(rows), round_size(config.batch_size)))

    def seconds(candidate: Any, turn: int) -> float:
        decoder = make_row_decoder(config.model_copy(update={"decode": candidate}))
        decoder.setup()
        start = time.perf_counter()
        failed = [r for r in decoder(round_rows(rows, per_part, turn)) if r.get("error")]  # a row's own fault (an unreadable image): alike for every candidate
        if failed:
            logger.warning("shape calibration: %d of %d row(s) failed with %s (e.g. %s)", len(failed), per_part,
                           candidate.method, failed[0]["error"])
        return time.perf_counter() - start

    captured = resolve_compile(config.decode.compile, probe.target.device)
    _, record = resolve_shape(config.decode, config.batch_size, seconds, per_part * parts, key, ShapeCache(), parts=parts, captured=captured)
    return {**record, "batch": config.batch_size, "calibration_rows": len(rows), "seconds": time.perf_counter() - started}


def remote_tuning(function: Any, num_cpus: float, num_gpus: float) -> Any:
    """``function`` as a Ray task with a worker's resources (and the driver's shape cache folder, when it sets one)."""
    import ray

    options: Dict[str, Any] = dict(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0)
    if os.environ.get("RAYDEC_CACHE_DIR"):  # the driver's shape cache, where the task runs too
        options["runtime_env"] = {"env_vars": {"RAYDEC_CACHE_DIR": os.environ["RAYDEC_CACHE_DIR"]}}
    return ray.remote(function).options(**options)


def log_choice(decode: Any, shape: Dict[str, Any]) -> None:
    logger.info("decode.%s='auto' at batch %d: %s (%s, %.0f s, %d calibration rows)",
                "jacobi" if decode.method in JACOBI_METHODS else "draft_tree", shape["batch"], shape["label"],
                "tuned now" if shape["tuned"] else "taken from the shape cache", shape["seconds"], shape["calibration_rows"])


def log_batch(batch: Dict[str, Any]) -> None:
    best = batch.get("best_batch")
    logger.info("batch_size='auto': %d (a row's KV cache %.1f MiB, weights %.2f GiB, %.0f%% of %.2f GiB%s)", batch["batch_size"],
                batch["kv_bytes_per_row"] / 2**20, batch["weights_bytes"] / 2**30, 100 * batch["max_memory_fraction"],
                batch["memory_bytes"] / 2**30, f"; at most {best}, the batch the shape cache shows fastest" if best else "")


def recorded_batch(job: JobConfig) -> Optional[Dict[str, Any]]:
    """The batch size the manifest in ``job``'s output records, once rows were written with it (its
    ``batch_size`` record, else the batch its recorded shape was tuned for)."""
    try:
        manifest = read_manifest(job.output)
    except (OSError, KeyError, ValueError):
        return None
    if not shard_uris(job.output):
        return None
    batch = manifest.get("batch_size")
    if isinstance(batch, dict) and isinstance(batch.get("batch_size"), int):
        return batch
    shape = manifest.get("shape")
    if isinstance(shape, dict) and isinstance(shape.get("batch"), int):
        return {"batch_size": shape["batch"]}
    return None


def resolve_job_auto(
    job: JobConfig, fragments: List[Fragment], remote_args: Dict[str, Any],
) -> Tuple[JobConfig, Optional[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """(the job as its workers decode it, the shape record and the batch size record for the
    manifest; None where the config fixed them). A re-run takes what its output's manifest records."""
    from raydec.api.frontier import apply_shape

    batch: Optional[Dict[str, Any]] = None
    if job.pool.batch_size == "auto":
        batch = recorded_batch(job)
        if batch is not None:
            logger.info("pool.batch_size='auto': resuming with the batch size this output's manifest records, %d", batch["batch_size"])
            batch = {**batch, "from": "manifest"}
            job = job.model_copy(update={"pool": job.pool.model_copy(update={"batch_size": batch["batch_size"]})})
    shape = recorded_shape(job) if job.decode.auto_shape and job.pool.batch_size != "auto" else None
    if shape is not None:
        logger.info("decode.%s='auto': resuming with the shape this output's manifest records, %s",
                    "jacobi" if job.decode.method in JACOBI_METHODS else "draft_tree", shape["label"])
        shape = {**shape, "tuned": False, "from": "manifest"}
    if job.pool.batch_size == "auto" or (job.decode.auto_shape and shape is None):
        import ray

        task = remote_tuning(tune_in_worker, remote_args.get("num_cpus", 1), remote_args.get("num_gpus", 0))
        chosen = ray.get(task.remote(job, fragments))
        if "batch" in chosen:
            batch = {**chosen["batch"], "from": "measured"}
            log_batch(batch)
            job = job.model_copy(update={"pool": job.pool.model_copy(update={"batch_size": batch["batch_size"]})})
        if "shape" in chosen:
            shape = {**chosen["shape"], "from": "tuned" if chosen["shape"].get("tuned") else "cache"}
            log_choice(job.decode, shape)
    if shape is not None:
        job = job.model_copy(update={"decode": apply_shape(job.decode, shape)})
    return job, shape, batch


def resolve_stage_auto(config: ProcessorConfig, dataset: Any) -> ProcessorConfig:
    """``build_processor``'s stage with its auto batch size and shape chosen once, before its actors
    start: on the dataset's first rows (validated as the stage validates them), in Ray tasks with an
    actor's resources. Every actor of the stage then decodes with that batch and shape."""
    if not (config.decode.auto_shape or config.batch_size == "auto"):
        return config
    import ray

    from raydec.api.frontier import apply_shape
    from raydec.api.tuner import CALIBRATION_ROWS, calibration_pool_size, round_size
    from raydec.io import validate_caption_rows, validate_t2i_rows

    validate = validate_t2i_rows if config.task == "t2i" else validate_caption_rows

    def first_rows(count: int) -> List[Dict[str, Any]]:
        first = dataset.limit(count * 4).take(count * 4)  # a few rows to the driver: bad ones are skipped
        rows = [row for row in validate(first, config.rows, file_key="calibration", first_row_index=0) if not row["error"]][:count]
        if not rows:
            raise ValueError("the dataset's first rows hold no valid row to choose the 'auto' batch size or draft shape on")
        return rows

    if config.batch_size == "auto":
        task = remote_tuning(choose_batch_on_rows, config.cpus_per_worker, config.gpus_per_worker)
        batch = ray.get(task.remote(config, first_rows(CALIBRATION_ROWS)))
        log_batch(batch)
        config = config.model_copy(update={"batch_size": batch["batch_size"]})
    if config.decode.auto_shape:
        task = remote_tuning(tune_on_rows, config.cpus_per_worker, config.gpus_per_worker)
        shape = ray.get(task.remote(config, first_rows(calibration_pool_size(round_size(config.batch_size)))))
        log_choice(config.decode, shape)
        config = config.model_copy(update={"decode": apply_shape(config.decode, shape)})
    return config
