"""Typed configuration for the io layer: S3 access, input datasets and job outputs.

Every model forbids unknown keys, so a typo in a job file fails at load time with the
offending key named, long before any model is loaded.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Optional
from urllib.parse import urlparse

from pydantic import Field, field_validator

from raydec.validation import StrictModel

InputFormat = Literal["parquet", "jsonl", "csv"]
"""File formats the dataset readers understand."""

Task = Literal["t2i", "caption"]
"""`t2i`: text-to-image rows (`prompt`); `caption`: captioning rows (`image` / `image_uri`)."""


class IOConfigError(ValueError):
    """A job-level problem with inputs or outputs; raised before any model loads."""


class DatasetSchemaError(IOConfigError):
    """An input file lacks a required column, or the input matches no files."""


class OutputNotWritableError(IOConfigError):
    """The output location cannot be created or written (missing bucket, no endpoint, ...)."""


def _first_env(*names: str) -> Optional[str]:
    """Return the first non-empty environment variable among `names`, else None."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


class S3Config(StrictModel):
    """How to reach S3 (or an S3-compatible endpoint such as moto or MinIO).

    Unset fields fall back to the standard AWS environment variables when the config is
    used (see `resolved()`), so secrets need not appear in job files.
    """

    endpoint_url: Optional[str] = Field(
        None,
        description="S3 endpoint such as http://127.0.0.1:9000; default AWS_ENDPOINT_URL_S3 / "
        "AWS_ENDPOINT_URL, else AWS S3 itself.",
    )
    region: Optional[str] = Field(
        None, description="Region; default AWS_REGION / AWS_DEFAULT_REGION, else us-east-1."
    )
    access_key_id: Optional[str] = Field(
        None, description="Access key; default AWS_ACCESS_KEY_ID, else the AWS credential chain."
    )
    secret_access_key: Optional[str] = Field(
        None, repr=False, description="Secret key; default AWS_SECRET_ACCESS_KEY."
    )
    session_token: Optional[str] = Field(
        None, repr=False, description="Session token for temporary credentials; default AWS_SESSION_TOKEN."
    )
    connect_timeout_s: float = Field(
        3.0, gt=0, le=300, description="Seconds to wait for a TCP connection to the endpoint."
    )
    request_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="Seconds to wait for one S3 request to complete."
    )
    max_attempts: int = Field(
        3, ge=1, le=20, description="Attempts per S3 request, including the first (retries on throttling / 5xx)."
    )

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_has_scheme(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"endpoint_url: {value!r} must start with http:// or https://")
        if value is not None and not urlparse(value).netloc:
            raise ValueError(f"endpoint_url: {value!r} names no host (e.g. http://127.0.0.1:9000)")
        return value.rstrip("/") if value else value

    def resolved(self) -> "S3Config":
        """Return a copy with unset fields filled from the standard AWS_* environment variables."""
        endpoint = self.endpoint_url or _first_env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        return S3Config(
            endpoint_url=endpoint,
            region=self.region or _first_env("AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=self.access_key_id or _first_env("AWS_ACCESS_KEY_ID"),
            secret_access_key=self.secret_access_key or _first_env("AWS_SECRET_ACCESS_KEY"),
            session_token=self.session_token or _first_env("AWS_SESSION_TOKEN"),
            connect_timeout_s=self.connect_timeout_s,
            request_timeout_s=self.request_timeout_s,
            max_attempts=self.max_attempts,
        )


def _check_location(value: str) -> str:
    """A local path or ``s3://bucket[/prefix]``: other schemes and a missing bucket are errors."""
    scheme, separator, rest = value.partition("://")
    if not separator and value.lower().startswith("s3:"):
        raise ValueError(f"{value!r}: an S3 location is written s3://bucket/prefix")
    if separator:
        if scheme != "s3":
            raise ValueError(f"{value!r}: unsupported scheme {scheme}:// (use a local path or s3://bucket/prefix)")
        if not rest.split("/", 1)[0]:
            raise ValueError(f"{value!r}: no bucket name (use s3://bucket/prefix)")
    return value


def _column(name: str, description: str) -> Any:
    """A column-name field: a non-empty string."""
    return Field(name, min_length=1, description=description)


class RowFormat(StrictModel):
    """How rows name their columns and what a row may hold: shared by a job's input files and a
    user's own Dataset (``build_processor``). A row past a limit becomes an error row."""

    id_column: str = _column("id", "Column holding the row id; derived from file and row when absent.")
    prompt_column: str = _column("prompt", "Text-to-image prompt / captioning instruction column.")
    negative_prompt_column: str = _column("negative_prompt", "Optional negative prompt column (t2i).")
    seed_column: str = _column("seed", "Optional per-row seed column; derived from id and `seed` when absent.")
    image_column: str = _column("image", "Captioning: column of encoded image bytes.")
    image_uri_column: str = _column("image_uri", "Captioning: column of local paths or s3:// URIs.")
    max_prompt_words: int = Field(256, ge=1, le=100_000, description="Longer prompts become row errors.")
    max_prompt_chars: int = Field(4096, ge=1, le=1_000_000, description="Longer prompts become row errors.")
    max_image_bytes: int = Field(
        64 * 2**20, ge=1, description="Larger encoded images become row errors instead of being decoded."
    )
    max_image_pixels: int = Field(
        16 * 2**20, ge=1,
        description="Images whose header declares more pixels (width x height) become row errors, checked before "
        "decoding (a small file can declare a huge canvas).",
    )
    seed: int = Field(0, ge=0, lt=2**63, description="Job seed from which rows without a seed derive theirs.")
    s3: S3Config = Field(default_factory=S3Config, description="S3 access for s3:// inputs and image URIs.")


class InputConfig(RowFormat):
    """Where a job's rows come from and how their columns are named and checked."""

    path: str = Field(
        ...,
        min_length=1,
        description="A local file, folder or glob (e.g. data/*.parquet), or s3://bucket/prefix "
        "(a key, a prefix, or a glob under a prefix).",
    )
    format: Optional[InputFormat] = Field(
        None,
        description="File format; inferred from each file's extension when unset. When set, folders "
        "and globs keep files with that format's extension or none.",
    )

    @field_validator("path")
    @classmethod
    def _path_is_local_or_s3(cls, value: str) -> str:
        return _check_location(value)


class OutputConfig(StrictModel):
    """Where a job writes images, result shards and its manifest."""

    path: str = Field(
        ...,
        min_length=1,
        description="Local folder or s3://bucket/prefix; images/, results/ and manifest.json go under it.",
    )
    image_format: Literal["png"] = Field("png", description="Encoding of generated images.")
    shard_size: int = Field(256, ge=1, le=1_000_000, description="Result rows per Parquet shard.")
    s3: S3Config = Field(default_factory=S3Config, description="S3 access for s3:// outputs.")

    @field_validator("path")
    @classmethod
    def _path_is_local_or_s3(cls, value: str) -> str:
        return _check_location(value)
