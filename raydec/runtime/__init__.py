"""raydec.runtime: Ray Data batch pipelines over worker actors (one model per actor).

    from raydec.runtime import JobConfig, connect_ray, preflight, run_job
    job = JobConfig.from_yaml("jobs/configs/t2i_reference.yaml")
    files = preflight(job)        # fails fast, before any model loads
    connect_ray()
    report = run_job(job, files)

    processor = build_processor(ProcessorConfig(task="t2i", model="reference"))   # a stage for your own Dataset
    images = processor(ray.data.read_parquet("prompts/"))
"""

from raydec.runtime.cluster import connect_ray, init_local_ray
from raydec.runtime.config import JobConfig, PoolConfig, ProcessorConfig
from raydec.runtime.pipeline import (
    JobIncompleteError,
    JobReport,
    ModelNotFoundError,
    check_model,
    preflight,
    run_job,
)
from raydec.runtime.row_decoders import ROW_DECODERS, RowDecoder, ImageRowDecoder, make_row_decoder
from raydec.runtime.resume import ResumeMismatchError, check_resume_compatible, job_weights
from raydec.runtime.stage import DatasetProcessor, build_processor

__all__ = [
    "DatasetProcessor", "JobConfig", "JobIncompleteError", "JobReport", "ModelNotFoundError", "ROW_DECODERS", "PoolConfig",
    "RowDecoder", "ProcessorConfig", "ResumeMismatchError", "ImageRowDecoder", "build_processor", "check_model", "check_resume_compatible", "connect_ray",
    "init_local_ray", "job_weights", "make_row_decoder", "preflight", "run_job",
]
