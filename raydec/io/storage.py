"""A job's output location (a local folder or s3:// prefix), its filesystem resolved once:
atomic writes, listings, its result shards and its manifest.

    output = OutputLocation(job.output)
    earlier = output.earlier()                 # the manifest and results of earlier runs
    output.write_manifest(job, counts, timings, extra)

Layout under OUTPUT:

    images/{image_key(id)}.png
    results/part-{worker}-{seq:05d}.parquet    one row per finished input row
    manifest.json

Local writes go to a hidden temp name in the same folder and are renamed into place, so a
killed process never leaves a half-written file under the final name. S3 objects only
become visible when a PUT (or a multipart upload) completes, so S3 writes are atomic by
construction; boto3 switches to multipart uploads for large bodies. Listings skip temp and
hidden files, so a restart sees only whole shards.
"""

from __future__ import annotations

import io
import json
import logging
import os
import platform
import re
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Dict, List, Mapping, Optional, Union

import pyarrow.fs as pafs
from pydantic import BaseModel

from raydec.io.config import OutputNotWritableError, OutputConfig
from raydec.io.filesystem import S3_SCHEME, describe_endpoint, resolve_filesystem, s3_client

logger = logging.getLogger(__name__)

IMAGES_DIR = "images"
RESULTS_DIR = "results"
MANIFEST_NAME = "manifest.json"
SHARD_NAME = re.compile(r"^part-(?P<worker>.+)-(?P<seq>\d{5,})\.parquet$")
MULTIPART_THRESHOLD_BYTES = 16 * 2**20
TEMP_MARKER = ".tmp-"

_SECRET_KEYS = {"secret_access_key", "session_token", "access_key_id", "aws_secret_access_key",
                "aws_session_token", "aws_access_key_id", "password", "token"}
_VERSIONED_PACKAGES = ("raydec", "torch", "transformers", "ray", "pyarrow", "boto3", "pydantic", "numpy", "pillow")


@dataclass(frozen=True)
class EarlierOutput:
    """What an output holds from earlier runs, read once: its manifest (None: none readable) and
    whether any result shard is finished (rows were written: they fix the job and its plan)."""

    manifest: Optional[Dict[str, Any]]
    has_results: bool


class OutputLocation:
    """An output folder or s3:// prefix: its filesystem and its path there, resolved once.

    ``root`` is the path the filesystem takes (``bucket/prefix`` on S3, an absolute local path);
    ``uri`` is where the results go as a job names it (a local path made absolute).
    """

    def __init__(self, config: OutputConfig) -> None:
        self.config = config
        self.fs, self.root = resolve_filesystem(config.path, config.s3)
        self.is_s3 = isinstance(self.fs, pafs.S3FileSystem)
        self.uri = config.path if self.is_s3 else self.root

    def path_of(self, relative: str) -> str:
        """The filesystem's path of OUTPUT/relative."""
        return f"{self.root.rstrip('/')}/{relative.strip('/')}"

    def uri_of(self, relative: str) -> str:
        """The URI that OUTPUT/relative has (an absolute path when local)."""
        return (S3_SCHEME if self.is_s3 else "") + self.path_of(relative)

    def put(self, relative: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Write `data` atomically to OUTPUT/relative and return its URI."""
        if self.is_s3:
            self._put_s3(relative, data, content_type)
        else:
            _put_local(self.path_of(relative), data)
        return self.uri_of(relative)

    def _put_s3(self, relative: str, data: bytes, content_type: str) -> None:
        """One PUT for small bodies, a multipart upload for large ones; both appear atomically."""
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, key = self.path_of(relative).partition("/")
        transfer = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD_BYTES, use_threads=False)
        try:
            s3_client(self.config.s3).upload_fileobj(
                io.BytesIO(data), bucket, key, ExtraArgs={"ContentType": content_type}, Config=transfer
            )
        except (BotoCoreError, ClientError) as exc:
            raise OSError(f"cannot write {self.uri_of(relative)} (endpoint {describe_endpoint(self.config.s3)}): {exc}") from None

    def list_files(self, relative: str) -> List[str]:
        """Base names of the visible (non-temp, non-hidden) files directly under OUTPUT/relative."""
        selector = pafs.FileSelector(self.path_of(relative), recursive=False, allow_not_found=True)
        names = [os.path.basename(i.path) for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]
        return sorted(n for n in names if not n.startswith((".", "_")) and TEMP_MARKER not in n)

    def read(self, relative: str) -> bytes:
        """The bytes of OUTPUT/relative."""
        with self.fs.open_input_stream(self.path_of(relative)) as stream:
            return stream.read()

    def shard_names(self) -> List[str]:
        """The finished result shards under results/, in name order (temp and stray files ignored)."""
        return [name for name in self.list_files(RESULTS_DIR) if SHARD_NAME.match(name)]

    def shard_uris(self) -> List[str]:
        """URIs of the finished result shards, in name order."""
        return [self.uri_of(f"{RESULTS_DIR}/{name}") for name in self.shard_names()]

    def read_manifest(self) -> Dict[str, Any]:
        """The parsed OUTPUT/manifest.json."""
        return json.loads(self.read(MANIFEST_NAME))

    def earlier(self) -> EarlierOutput:
        """The manifest and whether finished result shards sit beside it (only looked for when there is one)."""
        try:
            manifest = self.read_manifest()
        except (OSError, KeyError, ValueError):  # no manifest yet (OSError covers missing files)
            return EarlierOutput(None, False)
        return EarlierOutput(manifest, bool(self.shard_names()))

    def write_manifest(
        self,
        config: Union[BaseModel, Mapping[str, Any]],
        counts: Mapping[str, int],
        timings: Mapping[str, float],
        extra: Optional[Mapping[str, Any]] = None,
    ) -> str:
        """Write OUTPUT/manifest.json (config with credentials redacted, versions, counts, timings,
        ``extra``); returns its URI."""
        config_data = config.model_dump(mode="json") if isinstance(config, BaseModel) else dict(config)
        manifest = {
            "config": redact_secrets(config_data),
            "versions": package_versions(),
            "platform": platform.platform(),
            "counts": dict(counts),
            "timings": dict(timings),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(dict(extra) if extra else {}),
        }
        data = json.dumps(manifest, indent=2, sort_keys=True, default=str).encode("utf-8")
        return self.put(MANIFEST_NAME, data, "application/json")

    def check_writable(self) -> None:
        """Fail fast, with a clear message, if the output cannot be written.

        Local: the folder is created and a probe file written and removed. S3: the bucket is
        checked with one short-timeout request (no retries), then a probe object is written and
        deleted under the prefix.
        """
        if self.is_s3:
            self._check_s3_writable()
            return
        path = self.root
        try:
            if os.path.exists(path) and not os.path.isdir(path):
                raise OutputNotWritableError(f"output.path: {self.config.path} exists and is not a folder")
            os.makedirs(path, exist_ok=True)
            probe = os.path.join(path, f"_raydec_probe-{uuid.uuid4().hex[:8]}")
            _put_local(probe, b"probe")
            os.remove(probe)
        except OSError as exc:
            raise OutputNotWritableError(f"output.path: {self.config.path} is not writable ({exc.strerror or exc})") from None

    def _check_s3_writable(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        output = self.config
        bucket, _, key = self.path_of(f"_raydec_probe-{uuid.uuid4().hex[:8]}").partition("/")
        client = s3_client(output.s3.model_copy(update={"max_attempts": 1}))
        endpoint = describe_endpoint(output.s3)
        try:
            client.head_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key=key, Body=b"probe")
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
            client.delete_object(Bucket=bucket, Key=key)
        except (BotoCoreError, ClientError) as exc:
            logger.warning("could not delete probe object s3://%s/%s: %s", bucket, key, exc)


def as_output(output: Union[OutputConfig, str, "os.PathLike[str]"]) -> OutputConfig:
    """An OutputConfig, or a job's output folder / s3:// prefix (S3 settings from the environment)."""
    return output if isinstance(output, OutputConfig) else OutputConfig(path=os.fspath(output))


def check_output_writable(output: OutputConfig) -> None:
    """Fail fast, with a clear message, if ``output`` cannot be written (``OutputLocation.check_writable``)."""
    OutputLocation(output).check_writable()


def redact_secrets(value: Any) -> Any:
    """Replace credential values with '***' anywhere in a nested config."""
    if isinstance(value, Mapping):
        return {k: ("***" if k in _SECRET_KEYS and v is not None else redact_secrets(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_secrets(v) for v in value]
    return value


def package_versions() -> Dict[str, Optional[str]]:
    """Versions of Python and the packages that shape results (None when not installed)."""
    versions: Dict[str, Optional[str]] = {"python": platform.python_version()}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _put_local(path: str, data: bytes) -> None:
    """Write to a hidden temporary file beside the target (`.NAME` + TEMP_MARKER + 12 random hex digits),
    fsync, then rename over the target."""
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
