"""Typed configuration of a batch job: the worker pool and the whole job.

`JobConfig.from_yaml(path)` validates a YAML file against these models; unknown keys are
errors that name the key, so a typo fails before any model loads.
"""

from __future__ import annotations

import os
from typing import ClassVar, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from raydec.config import (
    CAPTION_METHODS, IMAGE_METHODS, IMAGE_SIZE_PATTERN, MEMORY_FRACTION_FIELD, MODEL_NAME_DESCRIPTION, batch_size_type, DecodeConfig,
    DType, StrictModel, check_batch_size,
)
from raydec.io.config import InputConfig, IOConfigError, OutputConfig, RowFormat
from raydec.io.datasets import listing_root
from raydec.io.filesystem import is_s3_uri


def check_method(task: str, decode: DecodeConfig) -> None:
    """``decode.method`` is one of ``task``'s methods (an error naming both otherwise)."""
    methods = IMAGE_METHODS if task == "t2i" else CAPTION_METHODS
    if decode.method not in methods:
        kind = "text-to-image" if task == "t2i" else "captioning"
        raise ValueError(f"decode.method: {decode.method!r} is not a {kind} method (use {', '.join(methods)})")


SIZE_FIELD = Field(
    None, pattern=IMAGE_SIZE_PATTERN,
    description="t2i: image size WIDTHxHEIGHT in pixels (Emu3: multiples of 8; Lumina-mGPT / Chameleon: multiples of 32; Janus: "
    "its one size); unset or 'auto': the model's own.",
)


VQGAN_PATH_FIELD = Field(
    None, min_length=1,
    description="t2i, Lumina-mGPT / Chameleon: the folder (or hub id, or s3:// prefix) of the VQ-GAN that decodes the image codes (vqgan.yaml, vqgan.ckpt; "
    "Lumina-mGPT keeps Meta's in ckpts/chameleon/tokenizer/); unset: vqgan/ inside the model's folder.",
)


def check_size(task: str, size: Optional[str], vqgan_path: Optional[str] = None) -> None:
    """A size and a VQ-GAN folder only for text-to-image (a captioning job's images are its inputs)."""
    if task != "t2i" and size not in (None, "auto"):
        raise ValueError(f"size: {size!r} is set, but only text-to-image makes images (task {task!r})")
    if task != "t2i" and vqgan_path is not None:
        raise ValueError(f"vqgan_path: {vqgan_path!r} is set, but only text-to-image decodes images (task {task!r})")


class PoolConfig(StrictModel):
    """The Ray Data actor pool that runs the model: one model copy per actor."""

    workers: int = Field(1, ge=1, le=4096, description="Actors in the pool, each loading the model once (the most, with min_workers).")
    min_workers: Optional[int] = Field(
        None, ge=1, le=4096,
        description="Set: an autoscaling pool that Ray Data grows from min_workers to workers actors as the queue asks; "
        "unset: a fixed pool of workers.",
    )
    gpus_per_worker: float = Field(
        0.0, ge=0.0, le=1.0,
        description="GPUs per actor, at most 1 (an actor's model runs on one GPU; fractional shares one); 0 runs on CPU.",
    )
    cpus_per_worker: float = Field(
        0.5, gt=0.0, le=256.0,
        description="CPUs reserved per actor; keep fractional on small machines or Ray Data pools deadlock.",
    )
    batch_size: batch_size_type(4096) = Field(
        8, description="Rows per actor call (one durable result shard each), decoded together; auto: the most whose KV cache "
        "fits max_memory_fraction of a worker's memory beside the weights (at most the batch the shape tuner measured "
        "fastest, and 256), chosen before the pool starts and recorded in the manifest.",
    )
    max_memory_fraction: float = MEMORY_FRACTION_FIELD
    max_restarts: int = Field(3, ge=-1, le=1000, description="Times Ray restarts a dead actor; -1 means forever.")
    max_task_retries: int = Field(
        3, ge=-1, le=1000, description="Times a batch lost with its actor is retried; -1 means forever."
    )
    torch_threads: Optional[int] = Field(
        None, ge=1, le=256,
        description="torch.set_num_threads in each actor; unset: the actor's CPUs (cpus_per_worker rounded down, at least 1).",
    )

    _batch_size = field_validator("batch_size", mode="before")(classmethod(lambda cls, value: check_batch_size(value, 4096)))

    @model_validator(mode="after")
    def _min_within_max(self) -> "PoolConfig":
        if self.min_workers is not None and self.min_workers > self.workers:
            raise ValueError(f"pool.min_workers={self.min_workers} is more than pool.workers={self.workers} (the pool's most)")
        return self


class ProcessorConfig(StrictModel):
    """A text-to-image or captioning stage over a Ray Dataset (``build_processor``): the model,
    its decoding, the row columns and limits, and the actor pool that runs it."""

    task: Literal["t2i", "caption"] = Field("t2i", description="t2i: prompts to images; caption: images to text.")
    model: str = Field(..., min_length=1, description=MODEL_NAME_DESCRIPTION + " s3:// is read with rows.s3.")
    dtype: DType = Field("float32", description="Weights and compute dtype.")
    decode: DecodeConfig = Field(default_factory=DecodeConfig, description="Decoding method and sampling; an unset draft "
                                 "shape is the method's default, as everywhere; 'auto' (jacobi: auto, draft_tree: auto) tunes it "
                                 "for the batch size on the device, once, and the manifest records it.")

    rows: RowFormat = Field(default_factory=RowFormat, description="Column names, row limits, the seed for rows without one.")
    concurrency: Union[int, tuple[int, int]] = Field(
        1, description="Actors running the model: a fixed number, or (min, max) for a pool Ray Data grows and shrinks.",
    )
    batch_size: batch_size_type(4096) = Field(
        8, description="Rows per actor call (decoded together); auto: the most that fit max_memory_fraction of an actor's "
        "memory (see JobConfig's pool.batch_size), chosen before the actors start.",
    )
    max_memory_fraction: float = MEMORY_FRACTION_FIELD
    _batch_size = field_validator("batch_size", mode="before")(classmethod(lambda cls, value: check_batch_size(value, 4096)))
    cpus_per_worker: float = Field(0.5, gt=0.0, le=256.0, description="CPUs reserved per actor.")
    gpus_per_worker: float = Field(0.0, ge=0.0, le=1.0, description="GPUs per actor (the model runs on cuda); 0 runs on CPU.")
    torch_threads: Optional[int] = Field(
        None, ge=1, le=256,
        description="torch.set_num_threads in each actor; unset: the actor's CPUs (cpus_per_worker rounded down, at least 1).",
    )
    images_to: Optional[OutputConfig] = Field(
        None, description="t2i: write PNGs under this location and return their `image_uri`; unset: return PNG bytes in `image`.",
    )
    size: Optional[str] = SIZE_FIELD
    vqgan_path: Optional[str] = VQGAN_PATH_FIELD

    @property
    def threads(self) -> int:
        """The torch threads an actor uses: torch_threads, else the CPUs Ray reserves for it."""
        return self.torch_threads or max(1, int(self.cpus_per_worker))

    @model_validator(mode="after")
    def _fits(self) -> "ProcessorConfig":
        check_method(self.task, self.decode)
        if isinstance(self.concurrency, tuple):
            low, high = self.concurrency
            if not 1 <= low <= high:
                raise ValueError(f"concurrency: {self.concurrency} must be (min, max) with 1 <= min <= max")
        elif self.concurrency < 1:
            raise ValueError(f"concurrency: {self.concurrency} must be >= 1")
        if self.images_to is not None and self.task != "t2i":
            raise ValueError("images_to: only text-to-image stages write images")
        check_size(self.task, self.size, self.vqgan_path)
        return self


class JobConfig(StrictModel):
    """One batch job: what to run, on which rows, where results go and on how many workers."""

    config_error: ClassVar[type[ValueError]] = IOConfigError  # from_yaml's error names the file and bad keys

    task: Literal["t2i", "caption"] = Field("t2i", description="t2i: prompts to images; caption: images to text.")
    model: str = Field(..., min_length=1, description=MODEL_NAME_DESCRIPTION + " s3:// is read with input.s3.")
    dtype: DType = Field("float32", description="Weights and compute dtype.")
    input: InputConfig = Field(..., description="Input rows (local / glob / s3://).")
    output: OutputConfig = Field(..., description="Output location for images, result shards and the manifest.")
    decode: DecodeConfig = Field(default_factory=DecodeConfig, description="Decoding method and sampling; an unset draft "
                                 "shape is the method's default, as everywhere; 'auto' (jacobi: auto, draft_tree: auto) tunes it "
                                 "for the batch size on the device, once, and the manifest records it.")

    size: Optional[str] = SIZE_FIELD
    vqgan_path: Optional[str] = VQGAN_PATH_FIELD
    pool: PoolConfig = Field(default_factory=PoolConfig, description="Ray actor pool.")
    seed: Optional[int] = Field(
        None, ge=0, lt=2**63, description="Job seed for rows without a seed; overrides input.seed when set."
    )
    retry_errors: bool = Field(False, description="On a re-run, redo rows whose earlier result is an error.")
    max_rows: Optional[int] = Field(
        None, ge=1, description="Decode at most this many rows in this run (a trial run); a re-run without it "
        "continues with the rest. The manifest then says 'incomplete'.",
    )

    @model_validator(mode="after")
    def _one_job_seed(self) -> "JobConfig":
        if self.seed is not None and self.input.seed != self.seed:
            if "seed" in self.input.model_fields_set:
                raise ValueError(f"seed: job seed {self.seed} disagrees with input.seed {self.input.seed}; set one")
            self.input = self.input.model_copy(update={"seed": self.seed})
        return self

    @model_validator(mode="after")
    def _method_fits_task(self) -> "JobConfig":
        check_method(self.task, self.decode)
        check_size(self.task, self.size, self.vqgan_path)
        return self

    @model_validator(mode="after")
    def _output_outside_input(self) -> "JobConfig":
        inside = _location(self.output.path)
        root = _location(listing_root(self.input.path))
        if inside == root or inside.startswith(root.rstrip("/") + "/"):
            raise ValueError(
                f"output.path: {self.output.path!r} lies inside input.path {self.input.path!r}; a re-run would "
                f"read the job's own results and manifest as input rows (write the output elsewhere)"
            )
        return self

    def processor_config(self) -> ProcessorConfig:
        """The stage this job runs over its rows."""
        rows = RowFormat.model_validate({name: getattr(self.input, name) for name in RowFormat.model_fields})
        pool = self.pool
        return ProcessorConfig(
            task=self.task, model=self.model, dtype=self.dtype, decode=self.decode, rows=rows,
            concurrency=(pool.min_workers, pool.workers) if pool.min_workers is not None else pool.workers,
            batch_size=pool.batch_size, max_memory_fraction=pool.max_memory_fraction, cpus_per_worker=pool.cpus_per_worker, gpus_per_worker=pool.gpus_per_worker,
            torch_threads=pool.torch_threads, size=self.size, vqgan_path=self.vqgan_path,
        )

    @property
    def job_seed(self) -> int:
        """The seed rows without their own seed derive theirs from."""
        return self.input.seed


def _location(path: str) -> str:
    """A comparable form of a local path (absolute, links resolved) or an s3:// URI."""
    if is_s3_uri(path):
        return path.rstrip("/")
    return os.path.realpath(os.path.expanduser(path))

