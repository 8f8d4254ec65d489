"""Models kept in a bucket: ``s3://bucket/prefix/`` fetched into this node's model cache.

Layout under the cache (``$RAYDEC_CACHE_DIR/models``, else ``~/.cache/raydec/models``)::

    s3/<bucket>/<prefix>/<identity>/            a whole copy (what the loader reads), never written in place
    s3/<bucket>/<prefix>/<identity>.config/     its configs alone (what a driver's checks read)
    s3/<bucket>/<prefix>/.<identity>.partial-*  a copy being written; renamed when whole
    s3/<bucket>/<prefix>/.lock                  one process of the node fetches, the others wait

The identity is a digest of the objects' keys, sizes and ETags: a changed object is a new identity,
so a new copy is fetched and the old one is never loaded for it. A killed process leaves only a
``.partial`` folder, which the next fetch removes under the lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from raydec.models.source_names import (
    SOURCE_RECORD, FileSet, ModelName, ModelSourceError, is_config_file, node_lock, weight_files_wanted,
)

if TYPE_CHECKING:
    from raydec.io.config import S3Config

logger = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20
PARALLEL_FILES = 8


@dataclass(frozen=True)
class RemoteFile:
    """One object of a model's prefix."""

    relative: str  # its path under the prefix, e.g. "vqgan/vqgan.yaml"
    key: str
    size: int
    etag: str


def model_cache_root() -> Path:
    """``$RAYDEC_CACHE_DIR/models``, else ``~/.cache/raydec/models``."""
    root = os.environ.get("RAYDEC_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "raydec") / "models"


def _split(parsed: ModelName) -> tuple[str, str]:
    bucket, _, prefix = parsed.location[len("s3://"):].partition("/")
    return bucket, prefix.strip("/")


def list_model_files(parsed: ModelName, s3: Optional["S3Config"] = None) -> list[RemoteFile]:
    """The objects under the model's prefix that a loader reads (one weight format), sorted."""
    from botocore.exceptions import BotoCoreError, ClientError

    from raydec.io.filesystem import describe_endpoint, s3_client

    bucket, prefix = _split(parsed)
    found: list[RemoteFile] = []
    try:
        pages = s3_client(s3).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else "")
        for page in pages:
            for item in page.get("Contents", []):
                relative = item["Key"][len(prefix) + 1:] if prefix else item["Key"]
                if relative and not relative.endswith("/") and Path(relative).name != SOURCE_RECORD:
                    found.append(RemoteFile(relative, item["Key"], int(item["Size"]), str(item["ETag"]).strip('"')))
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        raise ModelSourceError(f"{parsed.field}: {parsed.text!r}: cannot list it at {describe_endpoint(s3)} ({code or error})") from None
    except BotoCoreError as error:
        raise ModelSourceError(f"{parsed.field}: {parsed.text!r}: cannot reach S3 endpoint {describe_endpoint(s3)} ({error})") from None
    if not found:
        raise ModelSourceError(f"{parsed.field}: {parsed.text!r} holds no objects at {describe_endpoint(s3)} (a checkpoint folder's files "
                               f"under s3://{bucket}/{prefix + '/' if prefix else ''})")
    wanted = set(weight_files_wanted([remote.relative for remote in found]))
    return sorted((remote for remote in found if remote.relative in wanted), key=lambda remote: remote.relative)


def identity_of(files: list[RemoteFile]) -> str:
    """``s3:<digest>`` of the files' paths, sizes and ETags."""
    digest = hashlib.sha256()
    for remote in files:
        digest.update(f"{remote.relative}\0{remote.size}\0{remote.etag}\n".encode())
    return f"s3:{digest.hexdigest()[:16]}"


def s3_identity(parsed: ModelName, s3: Optional["S3Config"] = None) -> str:
    """The identity of the model the prefix holds now (one listing, no downloads)."""
    return identity_of(list_model_files(parsed, s3))


def cached_folder(parsed: ModelName, identity: str, files: FileSet = "all") -> Path:
    """Where this node keeps the copy of ``parsed`` with ``identity``."""
    bucket, prefix = _split(parsed)
    name = identity.removeprefix("s3:") + (".config" if files == "config" else "")
    return model_cache_root() / "s3" / bucket / prefix / name


def s3_folder(parsed: ModelName, s3: Optional["S3Config"] = None, files: FileSet = "all") -> Path:
    """A whole local copy of the model at ``parsed`` (``files``: all, or its configs), fetched once per node."""
    remote_files = list_model_files(parsed, s3)
    identity = identity_of(remote_files)
    whole = cached_folder(parsed, identity)
    wanted = whole if files == "all" else cached_folder(parsed, identity, "config")
    if whole.is_dir():
        return whole
    if wanted.is_dir():
        return wanted
    with node_lock(wanted.parent / ".lock", parsed):
        if whole.is_dir():  # fetched while this process waited
            return whole
        if wanted.is_dir():
            return wanted
        _remove_partials(wanted.parent)
        chosen = remote_files if files == "all" else [remote for remote in remote_files if is_config_file(remote.relative)]
        _fetch(parsed, chosen, identity, wanted, s3)
        return wanted


def _remove_partials(folder: Path) -> None:
    """Copies left by killed processes (only the lock holder writes here, so none is in progress)."""
    for partial in folder.glob(".*.partial-*"):
        logger.info("removing an interrupted download: %s", partial)
        shutil.rmtree(partial, ignore_errors=True)


def _fetch(parsed: ModelName, files: list[RemoteFile], identity: str, destination: Path, s3: Optional["S3Config"]) -> None:
    """Write ``files`` into a partial folder beside ``destination``, then rename it into place."""
    from tqdm.auto import tqdm

    partial = destination.parent / f".{destination.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    partial.mkdir(parents=True)
    configs = cached_folder(parsed, identity, "config")  # files a config-only fetch already brought: copied, not fetched again
    total = sum(remote.size for remote in files)
    logger.info("model %s: downloading %d file(s), %.1f MB, into %s", parsed.text, len(files), total / 1e6, destination)
    started = time.monotonic()
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {parsed.text}", disable=not sys.stderr.isatty())
    finished = iter(range(1, len(files) + 1))  # next() is atomic under the GIL: a count the threads share

    def one(remote: RemoteFile) -> None:
        target = partial / remote.relative
        target.parent.mkdir(parents=True, exist_ok=True)
        local = configs / remote.relative
        if configs != destination and local.is_file() and local.stat().st_size == remote.size:
            shutil.copyfile(local, target)
            bar.update(remote.size)
        else:
            _download(parsed, remote, target, s3, bar.update)
        done = next(finished)
        bar.set_postfix_str(f"{done}/{len(files)} files")
        logger.info("model %s: %s (%.1f MB), %d/%d files", parsed.text, remote.relative, remote.size / 1e6, done, len(files))

    try:

        with ThreadPoolExecutor(max_workers=min(PARALLEL_FILES, len(files))) as pool:
            list(pool.map(one, files))
        record = {"name": parsed.text, "identity": identity, "files": [remote.relative for remote in files]}
        (partial / SOURCE_RECORD).write_text(json.dumps(record, indent=1))
        os.rename(partial, destination)  # whole or not at all: a reader sees the folder only once every file is in it
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        bar.close()
    logger.info("model %s: downloaded in %.1f s", parsed.text, time.monotonic() - started)


def _download(parsed: ModelName, remote: RemoteFile, target: Path, s3: Optional["S3Config"], progress) -> None:
    """One GET of ``remote`` (at the ETag listed: a changed object fails rather than mixing versions)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from raydec.io.filesystem import describe_endpoint, s3_client

    bucket, _ = _split(parsed)
    try:
        body = s3_client(s3).get_object(Bucket=bucket, Key=remote.key, IfMatch=remote.etag)["Body"]
        with open(target, "wb") as stream:
            for chunk in body.iter_chunks(CHUNK_BYTES):
                stream.write(chunk)
                progress(len(chunk))
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code in ("PreconditionFailed", "412"):
            raise ModelSourceError(f"{parsed.field}: {parsed.text!r}: {remote.relative} changed while it was downloading; run again") from None
        raise ModelSourceError(f"{parsed.field}: {parsed.text!r}: cannot read {remote.relative} at {describe_endpoint(s3)} ({code or error})") from None
    except BotoCoreError as error:
        raise ModelSourceError(f"{parsed.field}: {parsed.text!r}: reading {remote.relative} from {describe_endpoint(s3)} failed ({error})") from None
    if target.stat().st_size != remote.size:
        raise ModelSourceError(f"{parsed.field}: {parsed.text!r}: {remote.relative} arrived with {target.stat().st_size} bytes, "
                               f"the bucket lists {remote.size}; run again")
