"""Atomic object writes and listings under an output location (local folder or s3:// prefix).

Local writes go to a hidden temp name in the same folder and are renamed into place, so a
killed process never leaves a half-written file under the final name. S3 objects only
become visible when a PUT (or a multipart upload) completes, so S3 writes are atomic by
construction; boto3 switches to multipart uploads for large bodies.
"""

from __future__ import annotations

import io
import logging
import os
import uuid
from typing import List

import pyarrow.fs as pafs

from raydec.io.config import OutputNotWritableError, OutputConfig
from raydec.io.filesystem import (
    describe_endpoint,
    is_s3_uri,
    join_uri,
    resolve_filesystem,
    s3_client,
    split_s3_uri,
    to_uri,
)

logger = logging.getLogger(__name__)

MULTIPART_THRESHOLD_BYTES = 16 * 2**20
TEMP_MARKER = ".tmp-"


def put_bytes(output: OutputConfig, relative: str, data: bytes, content_type: str = "application/octet-stream") -> str:
    """Write `data` atomically to OUTPUT/relative and return its URI."""
    uri = join_uri(output.path, relative)
    if is_s3_uri(uri):
        _put_s3(output, uri, data, content_type)
    else:
        _put_local(uri, data)
    return uri


def _put_local(path: str, data: bytes) -> None:
    """Write to a hidden temporary file beside the target (`.NAME` + TEMP_MARKER + 12 random hex digits),
    fsync, then rename over the target."""
    path = os.path.abspath(os.path.expanduser(path[len("file://"):] if path.startswith("file://") else path))
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{name}{TEMP_MARKER}{uuid.uuid4().hex[:12]}")
    try:
        with open(temp, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise


def _put_s3(output: OutputConfig, uri: str, data: bytes, content_type: str) -> None:
    """One PUT for small bodies, a multipart upload for large ones; both appear atomically."""
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_s3_uri(uri)
    transfer = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD_BYTES, use_threads=False)
    try:
        s3_client(output.s3).upload_fileobj(
            io.BytesIO(data), bucket, key, ExtraArgs={"ContentType": content_type}, Config=transfer
        )
    except (BotoCoreError, ClientError) as exc:
        raise OSError(f"cannot write {uri} (endpoint {describe_endpoint(output.s3)}): {exc}") from None


def list_files(output: OutputConfig, relative: str) -> List[str]:
    """Base names of the visible (non-temp, non-hidden) files directly under OUTPUT/relative."""
    fs, path = resolve_filesystem(join_uri(output.path, relative), output.s3)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
    names = [os.path.basename(i.path) for i in infos if i.type == pafs.FileType.File]
    return sorted(n for n in names if not n.startswith((".", "_")) and TEMP_MARKER not in n)


def exists(output: OutputConfig, relative: str) -> bool:
    """Whether OUTPUT/relative exists (a HEAD request on S3)."""
    uri = join_uri(output.path, relative)
    if is_s3_uri(uri):
        from botocore.exceptions import ClientError

        bucket, key = split_s3_uri(uri)
        try:
            s3_client(output.s3).head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
    return os.path.exists(resolve_filesystem(uri)[1])


def read_bytes(output: OutputConfig, relative: str) -> bytes:
    """The bytes of OUTPUT/relative."""
    fs, path = resolve_filesystem(join_uri(output.path, relative), output.s3)
    with fs.open_input_stream(path) as stream:
        return stream.read()


def uri_of(output: OutputConfig, relative: str) -> str:
    """The URI that OUTPUT/relative has (local paths are made absolute)."""
    fs, path = resolve_filesystem(join_uri(output.path, relative), output.s3)
    return to_uri(fs, path)


def check_output_writable(output: OutputConfig) -> None:
    """Fail fast, with a clear message, if the output cannot be written.

    Local: the folder is created and a probe file written and removed. S3: the bucket is
    checked with one short-timeout request (no retries), then a probe object is written and
    deleted under the prefix.
    """
    if is_s3_uri(output.path):
        _check_s3_writable(output)
        return
    _, path = resolve_filesystem(output.path)
    try:
        if os.path.exists(path) and not os.path.isdir(path):
            raise OutputNotWritableError(f"output.path: {output.path} exists and is not a folder")
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f"_raydec_probe-{uuid.uuid4().hex[:8]}")
        _put_local(probe, b"probe")
        os.remove(probe)
    except OSError as exc:
        raise OutputNotWritableError(f"output.path: {output.path} is not writable ({exc.strerror or exc})") from None


def _check_s3_writable(output: OutputConfig) -> None:
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    bucket, prefix = split_s3_uri(output.path)
    quick = output.s3.model_copy(update={"max_attempts": 1})
    client = s3_client(quick)
    endpoint = describe_endpoint(output.s3)
    probe_key = join_uri(prefix, f"_raydec_probe-{uuid.uuid4().hex[:8]}").lstrip("/")
    try:
        client.head_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key=probe_key, Body=b"probe")
    except NoCredentialsError:
        raise OutputNotWritableError(
            f"output.path: {output.path}: no S3 credentials (set output.s3.access_key_id / "
            f"secret_access_key or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
        ) from None
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket", "NotFound"):
            reason = f"bucket {bucket!r} does not exist at {endpoint}"
        elif code in ("403", "AccessDenied", "Forbidden"):
            reason = f"access to bucket {bucket!r} denied at {endpoint}"
        else:
            reason = f"{code or exc} at {endpoint}"
        raise OutputNotWritableError(f"output.path: {output.path} is not writable: {reason}") from None
    except BotoCoreError as exc:
        raise OutputNotWritableError(
            f"output.path: {output.path} is not writable: cannot reach S3 endpoint {endpoint} ({exc})"
        ) from None
    try:
        client.delete_object(Bucket=bucket, Key=probe_key)
    except (BotoCoreError, ClientError) as exc:
        logger.warning("could not delete probe object s3://%s/%s: %s", bucket, probe_key, exc)
