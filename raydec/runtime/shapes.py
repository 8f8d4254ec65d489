"""A batch job's draft shape when its config says "auto": chosen once, before any row is decoded.

    job, shape = resolve_job_shape(job, fragments)   # the driver, before the pool starts

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
    """Choose the shape of ``job`` where a worker would run (a Ray task), on the input's first rows."""
    from raydec.api.frontier import CALIBRATION_ROWS

    rows = calibration_rows(job, fragments, max(job.pool.batch_size, CALIBRATION_ROWS))
    if not rows:
        raise ValueError(f"decode.jacobi='auto': input.path {job.input.path!r} has no valid row to tune the draft shape on")
    return tune_on_rows(job.processor_config(), rows)


def tune_on_rows(config: ProcessorConfig, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The record of ``raydec.api.frontier.resolve_shape`` for ``config``'s auto shape at its batch
    size, calibrated on ``rows`` (validated, error-free), with the batch size and the seconds it took."""
    from raydec.api.frontier import ShapeCache, device_name, resolve_shape, shape_key
    from raydec.runtime.row_decoders import make_row_decoder
    from raydec.runtime.resume import weights_of

    started = time.perf_counter()
    probe = make_row_decoder(config.model_copy(update={"decode": config.decode.model_copy(update={"method": "ar"})}))
    probe.setup()  # loads the model (cached for the candidates below) and sets the threads
    device = getattr(getattr(probe, "pipeline", None), "device", "cpu")
    weights = "+".join(f"{role}:{fingerprint}" for role, fingerprint in sorted(weights_of(config.task, config.model, config.decode).items()))
    key = shape_key(config.decode, weights, device_name(device), config.dtype, config.batch_size)

    def seconds(candidate: Any) -> float:
        decoder = make_row_decoder(config.model_copy(update={"decode": candidate}))
        decoder.setup()
        start = time.perf_counter()
        failed = [r for r in decoder(rows) if r.get("error")]  # a row's own fault (an unreadable image): alike for every candidate
        if failed:
            logger.warning("shape calibration: %d of %d row(s) failed with %s (e.g. %s)", len(failed), len(rows),
                           candidate.method, failed[0]["error"])
        return time.perf_counter() - start

    _, record = resolve_shape(config.decode, config.batch_size, seconds, len(rows), key, ShapeCache())
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


def resolve_job_shape(job: JobConfig, fragments: List[Fragment], remote_args: Dict[str, Any]) -> Tuple[JobConfig, Optional[Dict[str, Any]]]:
    """(the job as its workers decode it, the shape record for the manifest; None when the shape was fixed)."""
    if not job.decode.auto_shape:
        return job, None
    from raydec.api.frontier import apply_shape

    shape = recorded_shape(job)
    if shape is not None:
        logger.info("decode.%s='auto': resuming with the shape this output's manifest records, %s",
                    "jacobi" if job.decode.method in JACOBI_METHODS else "draft_tree", shape["label"])
        shape = {**shape, "tuned": False, "from": "manifest"}
    else:
        task = remote_tuning(tune_in_worker, remote_args.get("num_cpus", 1), remote_args.get("num_gpus", 0))
        import ray

        shape = ray.get(task.remote(job, fragments))
        shape["from"] = "tuned" if shape.get("tuned") else "cache"
        log_choice(job.decode, shape)
    return job.model_copy(update={"decode": apply_shape(job.decode, shape)}), shape


def resolve_stage_shape(config: ProcessorConfig, dataset: Any) -> ProcessorConfig:
    """``build_processor``'s stage with its auto shape chosen once, before its actors start: on the
    dataset's first rows (validated as the stage validates them), in a Ray task with an actor's
    resources. Every actor of the stage then decodes with that shape."""
    if not config.decode.auto_shape:
        return config
    import ray

    from raydec.api.frontier import CALIBRATION_ROWS, apply_shape
    from raydec.io import validate_caption_rows, validate_t2i_rows

    validate = validate_t2i_rows if config.task == "t2i" else validate_caption_rows
    count = max(config.batch_size, CALIBRATION_ROWS)
    first = dataset.limit(count * 4).take(count * 4)  # a few rows to the driver: bad ones are skipped
    rows = [row for row in validate(first, config.rows, file_key="calibration", first_row_index=0) if not row["error"]][:count]
    if not rows:
        raise ValueError("decode: 'auto' draft shape: the dataset's first rows hold no valid row to tune it on")
    task = remote_tuning(tune_on_rows, config.cpus_per_worker, config.gpus_per_worker)
    shape = ray.get(task.remote(config, rows))
    log_choice(config.decode, shape)
    return config.model_copy(update={"decode": apply_shape(config.decode, shape)})
