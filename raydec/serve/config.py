"""Typed configuration of the Serve app: the models it serves, its limits, media and keys.

One ``ServeConfig`` builds the app (``build_app``), the ``raydec serve --config`` command and the
``args`` of a Serve config file whose ``import_path`` is ``raydec.serve:app_builder``. A served
model reuses the batch side's ``DecodeConfig`` and dtypes.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal, Optional

from pydantic import Field, SecretStr, field_validator, model_validator

from raydec.config import (
    CAPTION_METHODS, IMAGE_METHODS, MEMORY_FRACTION_FIELD, MODEL_NAME_DESCRIPTION, batch_size_type, DecodeConfig, DType, check_batch_size,
)
from raydec.io.config import S3Config
from raydec.serve.media import MediaConfig
from raydec.validation import StrictModel

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"


class ServedModel(StrictModel):
    """One model behind the API, with its replicas (each runs one scheduler)."""

    renamed_keys: ClassVar[dict[str, str]] = {"max_batch_size": "batch_size", "num_gpus": "gpus_per_worker", "num_cpus": "cpus_per_worker"}

    name: str = Field(..., pattern=MODEL_NAME_PATTERN, description="The API's model id (the request's `model`).")
    task: Literal["t2i", "caption"] = Field(..., description="t2i: /v1/images/generations; caption: /v1/chat/completions.")
    model: str = Field("reference", min_length=1, description=MODEL_NAME_DESCRIPTION)
    dtype: DType = Field("float32", description="Weights and compute dtype.")
    vqgan_path: Optional[str] = Field(
        None, min_length=1,
        description="t2i, Lumina-mGPT / Chameleon: the folder (or hub id, or s3:// prefix) of the VQ-GAN that decodes the "
        "image codes (vqgan.yaml, vqgan.ckpt); unset: vqgan/ inside the model's folder.",
    )
    s3: S3Config = Field(default_factory=S3Config, description="S3 access for an s3:// model, draft_model or vqgan_path (each "
                         "replica fetches it into its node's model cache once); unset fields take the replica's AWS_* environment.")
    decode: DecodeConfig = Field(
        default_factory=DecodeConfig,
        description="Method and sampling; unset sampling takes the checkpoint's; an unset draft shape is the method's "
        "default, as everywhere. A draft shape 'auto' (jacobi: auto, draft_tree: auto): each replica takes the shape tuned "
        "for its batch size on its device from the shape cache, or tunes it at start on a few built-in calibration rows "
        "and caches it. Requests may change the method (within the task), cfg_scale and per-row temperature / top_k / top_p "
        "and coupling.",
    )
    batch_size: batch_size_type(1024) = Field(
        8, description="Rows one replica decodes together (continuous batching); auto: chosen at the replica's start, the "
        "most whose KV cache fits max_memory_fraction of its memory beside the weights (at most the batch the shape "
        "cache shows fastest, and 256).",
    )
    max_memory_fraction: float = MEMORY_FRACTION_FIELD
    follow_batch: bool = Field(
        True, description="t2i with a Jacobi method (sjd, sjd_ac, sjd_pac) and jacobi: auto: the replica plans a draft shape "
        "(or plain AR) for every batch bucket 1, 2, 4, ... up to batch_size (each from the shape cache, else tuned at start) "
        "and decodes each step with the plan of the smallest bucket holding the rows decoding then, switching once a "
        "changed bucket has held for a few steps; false: one plan, tuned for batch_size. Ignored for other methods and "
        "fixed shapes.",
    )
    stream_interval_s: float = Field(
        0.05, ge=0.0, le=10.0,
        description="caption: a streamed answer's new text goes out at most this often (seconds); its first text at once, "
        "the rest with the answer. Every event crosses two Ray hops (replica to ingress to proxy), so one per decode step "
        "costs throughput (docs/benchmarks.md, bench serve). "
        "0: after every decode step.",
    )
    prefill_budget_tokens: Optional[int] = Field(
        None, ge=1, le=1_000_000,
        description="Prompt tokens one step prefills at most (the left-padded window: rows times the longest prompt, images' "
        "tokens included, twice over with classifier-free guidance): requests that arrive together join in one prefill up "
        "to this many tokens, the rest at the next admission, after a decode step of the rows already decoding; a prompt "
        "longer than the budget joins alone and is prefilled in chunks, one per step. Decoding rows then wait out at most "
        "one bounded chunk per step, at the cost of later first tokens (docs/benchmarks.md, bench serve). None: every "
        "queued request that has a place joins in one prefill.",
    )
    _batch_size = field_validator("batch_size", mode="before")(classmethod(lambda cls, value: check_batch_size(value, 1024)))
    num_replicas: int = Field(1, ge=1, le=4096, description="Replicas when autoscaling_config is unset.")
    autoscaling_config: Optional[dict[str, Any]] = Field(
        None, description="Ray Serve autoscaling_config passed through (min_replicas, max_replicas, target_ongoing_requests, ...).",
    )
    gpus_per_worker: float = Field(
        0.0, ge=0.0, description="GPUs per replica (the model runs on cuda); 0 runs on CPU. At most 1: a replica decodes on one "
        "GPU (a fraction shares it); more GPUs serve more replicas.",
    )
    cpus_per_worker: float = Field(0.5, gt=0.0, le=256.0, description="CPUs reserved per replica.")
    torch_threads: int = Field(1, ge=1, le=256, description="torch.set_num_threads in each replica (CPU decoding).")
    engine_core: bool = Field(
        True, description="Each replica's engine process takes torch_threads cores of its node for itself: pinned to them "
        "(the highest-numbered free ones; the node keeps its first core for the rest; engines share cores when there are "
        "more engines than cores to spare; not in a container whose CPU quota is below the cores it sees) and raised to "
        "niceness 0 where the OS allows (Ray starts workers at 15). "
        "false: the engine floats as any Ray worker.",
    )
    max_ongoing_requests: int = Field(
        32, ge=1, le=100_000, description="Requests one replica holds at once (decoding or queued in its scheduler).",
    )
    max_queued_requests: int = Field(
        64, ge=-1, le=1_000_000,
        description="Requests waiting for a replica beyond max_ongoing_requests; past it the API answers 503 with "
        "Retry-After. -1: no limit.",
    )
    health_check_period_s: float = Field(10.0, gt=0, le=3600, description="Seconds between Serve's health checks.")
    health_check_timeout_s: float = Field(30.0, gt=0, le=3600, description="Seconds a health check may take.")

    def processor_config(self) -> Any:
        """The stage config a job with this model, decoding and worker would run (what the plan's
        calibration and the shape cache's key take)."""
        from raydec.runtime.config import ProcessorConfig  # lazy: keeps the ingress and Serve's proxies torch-free

        return ProcessorConfig(
            task=self.task, model=self.model, dtype=self.dtype, decode=self.decode, batch_size=self.batch_size,
            vqgan_path=self.vqgan_path, max_memory_fraction=self.max_memory_fraction, cpus_per_worker=self.cpus_per_worker,
            gpus_per_worker=min(1.0, self.gpus_per_worker), torch_threads=self.torch_threads, rows={"s3": self.s3},
        )

    @field_validator("gpus_per_worker")
    @classmethod
    def _one_gpu_at_most(cls, value: float) -> float:
        if value > 1.0:
            raise ValueError(f"{value:g}: a replica decodes on one GPU and does not split its model across GPUs; use 1 (or a "
                             f"fraction to share one) and more replicas (num_replicas, autoscaling_config) for more GPUs")
        return value

    @model_validator(mode="after")
    def _method_fits_task(self) -> "ServedModel":
        if self.task != "t2i" and self.vqgan_path is not None:
            raise ValueError(f"vqgan_path: {self.vqgan_path!r} is set, but only a t2i model decodes images (task {self.task!r})")
        methods = IMAGE_METHODS if self.task == "t2i" else CAPTION_METHODS
        if self.decode.method not in methods:
            raise ValueError(f"decode.method: {self.decode.method!r} does not serve task {self.task!r} (use {', '.join(methods)})")
        return self


class LimitsConfig(StrictModel):
    """What one request may ask for; past a limit the API answers 4xx naming it."""

    max_request_bytes: int = Field(20 * 2**20, ge=1024, description="Largest request body (413 past it).")
    max_prompt_chars: int = Field(4096, ge=1, le=1_000_000, description="Longest image prompt or chat text, in characters.")
    max_prompt_tokens: int = Field(4096, ge=1, le=1_000_000, description="Longest chat prompt in tokens, image tokens included.")
    max_tokens: int = Field(1024, ge=1, le=65536, description="Largest max_tokens / max_completion_tokens.")
    max_n: int = Field(4, ge=1, le=16, description="Largest `n` of an image request.")
    max_messages: int = Field(64, ge=1, le=4096, description="Most messages in one chat.")
    request_timeout_s: float = Field(300.0, gt=0, le=86400, description="A request still running after this gets 408.")
    header_timeout_s: float = Field(
        30.0, gt=0, le=3600,
        description="Seconds a connection may take to send a request's line and headers; past it a 408 and the connection "
        "is closed (set in the HTTP proxies of the Serve instance `raydec serve` starts).",
    )
    body_timeout_s: float = Field(60.0, gt=0, le=86400, description="Seconds a request's whole body may take to arrive; past it a 408.")
    retry_after_s: int = Field(5, ge=1, le=3600, description="Retry-After seconds of a 503 when replicas are full.")


class ServeConfig(StrictModel):
    """The whole Serve app: its models, HTTP options, keys, media access and limits."""

    models: list[ServedModel] = Field(..., min_length=1, description="Served models; names are unique.")
    host: str = Field("127.0.0.1", min_length=1, description="Address `raydec serve` binds (0.0.0.0 for every interface).")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port `raydec serve` binds.")
    route_prefix: str = Field("/", pattern=r"^/", description="Prefix of every route (e.g. /raydec).")
    api_keys: list[SecretStr] = Field(
        default_factory=list, description="Keys accepted in `Authorization: Bearer`; none and no api_keys_env: open access.",
    )
    api_keys_env: Optional[str] = Field(
        "RAYDEC_API_KEYS", description="Environment variable (in the ingress replica) holding comma-separated keys, added to api_keys.",
    )
    ingress_replicas: int = Field(1, ge=1, le=1024, description="Replicas of the HTTP ingress deployment.")
    ingress_max_ongoing_requests: int = Field(1024, ge=1, le=1_000_000, description="Requests one ingress replica holds at once.")
    media: MediaConfig = Field(default_factory=MediaConfig, description="How image_url parts are read (data URLs always).")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Request limits.")

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ServedModel]) -> list[ServedModel]:
        names = [m.name for m in models]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"model names must be unique; repeated: {repeated}")
        return models

    def keys(self) -> set[str]:
        """The accepted API keys (config and environment); empty: no key needed."""
        keys = {key.get_secret_value() for key in self.api_keys}
        if self.api_keys_env and os.environ.get(self.api_keys_env):
            keys |= {k.strip() for k in os.environ[self.api_keys_env].split(",") if k.strip()}
        return keys

    def model(self, name: str) -> ServedModel | None:
        return next((m for m in self.models if m.name == name), None)
