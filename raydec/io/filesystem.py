"""Turn a URI into a pyarrow FileSystem and path, and build boto3 clients from the same config.

pyarrow handles streaming reads and listings; boto3 handles object-level work (single
puts, multipart uploads, existence checks). Both are built from one `S3Config`, resolved
against the standard AWS environment variables. `pyarrow.fs.S3FileSystem()` ignores
`AWS_ENDPOINT_URL`, so the endpoint is always passed explicitly.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Optional, Tuple
from urllib.parse import urlparse

import pyarrow.fs as pafs

from raydec.io.config import S3Config

logger = logging.getLogger(__name__)

S3_SCHEME = "s3://"


def is_s3_uri(uri: str) -> bool:
    """True for `s3://bucket/...` URIs."""
    return uri.startswith(S3_SCHEME)


def split_s3_uri(uri: str) -> Tuple[str, str]:
    """Split `s3://bucket/key` into (bucket, key); the key may be empty."""
    if not is_s3_uri(uri):
        raise ValueError(f"uri: {uri!r} is not an s3:// URI")
    bucket, _, key = uri[len(S3_SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"uri: {uri!r} has no bucket name")
    return bucket, key


def to_uri(fs: pafs.FileSystem, path: str) -> str:
    """Inverse of `resolve_filesystem`: the user-facing URI of a filesystem path."""
    if isinstance(fs, pafs.S3FileSystem):
        return S3_SCHEME + path
    return path


def _s3_key(s3: S3Config) -> Tuple[Any, ...]:
    """Hashable identity of a resolved S3 config (used to cache clients)."""
    return tuple(s3.model_dump().values())


@functools.lru_cache(maxsize=16)
def _cached_s3_filesystem(key: Tuple[Any, ...]) -> pafs.S3FileSystem:
    s3 = S3Config(**dict(zip(S3Config.model_fields, key)))
    kwargs: dict = dict(
        region=s3.region,
        access_key=s3.access_key_id,
        secret_key=s3.secret_access_key,
        session_token=s3.session_token,
        connect_timeout=s3.connect_timeout_s,
        request_timeout=s3.request_timeout_s,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=s3.max_attempts),
    )
    if s3.endpoint_url:
        parsed = urlparse(s3.endpoint_url)
        kwargs["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
        kwargs["scheme"] = parsed.scheme
    if not (s3.access_key_id and s3.secret_access_key):
        # Let pyarrow use the AWS credential chain (config files, instance metadata).
        kwargs.pop("access_key")
        kwargs.pop("secret_key")
        kwargs.pop("session_token")
    logger.debug("creating S3FileSystem endpoint=%s region=%s", s3.endpoint_url, s3.region)
    return pafs.S3FileSystem(**kwargs)


def s3_filesystem(s3: Optional[S3Config] = None) -> pafs.S3FileSystem:
    """A (cached) pyarrow S3FileSystem for `s3`, with env-var fallbacks applied."""
    return _cached_s3_filesystem(_s3_key((s3 or S3Config()).resolved()))


def resolve_filesystem(uri: str, s3: Optional[S3Config] = None) -> Tuple[pafs.FileSystem, str]:
    """Map a local path, `file://` URI or `s3://bucket/key` URI to (FileSystem, path).

    The returned path is what the FileSystem expects: `bucket/key` for S3 and an absolute
    path for local files.
    """
    if is_s3_uri(uri):
        bucket, key = split_s3_uri(uri)
        return s3_filesystem(s3), f"{bucket}/{key}".rstrip("/")
    if "://" in uri and not uri.startswith("file://"):
        raise ValueError(f"path: {uri!r} has an unsupported scheme (use a local path or s3://)")
    local = uri[len("file://"):] if uri.startswith("file://") else uri
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(local))


@functools.lru_cache(maxsize=16)
def _cached_s3_client(key: Tuple[Any, ...]) -> Any:
    import boto3
    from botocore.config import Config

    s3 = S3Config(**dict(zip(S3Config.model_fields, key)))
    botocore_config = Config(
        connect_timeout=s3.connect_timeout_s,
        read_timeout=s3.request_timeout_s,
        retries={"max_attempts": s3.max_attempts, "mode": "standard"},
        s3={"addressing_style": "path"} if s3.endpoint_url else {},
    )
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        region_name=s3.region,
        aws_access_key_id=s3.access_key_id,
        aws_secret_access_key=s3.secret_access_key,
        aws_session_token=s3.session_token,
        config=botocore_config,
    )


def s3_client(s3: Optional[S3Config] = None) -> Any:
    """A (cached, thread-safe) boto3 S3 client for `s3`, with env-var fallbacks applied."""
    return _cached_s3_client(_s3_key((s3 or S3Config()).resolved()))


def describe_endpoint(s3: Optional[S3Config] = None) -> str:
    """A short human description of where S3 requests go, for error messages."""
    return (s3 or S3Config()).resolved().endpoint_url or "AWS S3"


#: files a reader of a checkpoint folder looks at first: uploaded last, so one that sees them sees the rest
_UPLOADED_LAST = (".json", ".yaml", ".yml", ".md")


def publish_folder(folder: str | os.PathLike, uri: str, s3: Optional[S3Config] = None) -> str:
    """Upload every file under ``folder`` to ``uri`` (``s3://bucket/prefix``), weights and other data
    first, configs last; returns ``uri``. An OSError names the file and the endpoint on failure."""
    from pathlib import Path

    bucket, prefix = split_s3_uri(uri)
    root = Path(folder)
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: (p.name.endswith(_UPLOADED_LAST), p.as_posix()))
    client = s3_client(s3)
    for path in files:
        key = "/".join(part for part in (prefix.strip("/"), path.relative_to(root).as_posix()) if part)
        try:
            client.upload_file(str(path), bucket, key)
        except Exception as error:  # noqa: BLE001 - boto3's errors vary; the user needs the file and the endpoint
            raise OSError(f"cannot upload {path} to s3://{bucket}/{key} (endpoint {describe_endpoint(s3)}): {error}") from None
        logger.info("uploaded %s to s3://%s/%s", path.name, bucket, key)
    return uri
