"""Model names as users write them, parsed: a local folder, a Hugging Face hub id or an ``s3://``
prefix (``parse_model_name``), and the facts about checkpoint files every source shares (which
files a loader reads, a local folder's weights fingerprint). ``sources`` resolves them."""

from __future__ import annotations

import re
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Optional

SourceKind = Literal["local", "hub", "s3"]
FileSet = Literal["all", "config"]
"""all: what the loader reads (weights included); config: the small files checks read (configs,
tokenizer, templates), so a driver can validate a job without fetching weights."""

#: what a folder resolved from a bucket records about its source (name, identity, files)
SOURCE_RECORD = ".raydec-source.json"

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(@[A-Za-z0-9_./-]+)?$")
#: weight formats a loader skips when the checkpoint has safetensors (never fetch both)
OTHER_WEIGHT_FORMATS = ("*.bin", "*.pt", "*.pth", "*.msgpack", "*.h5", "*.ot", "*.onnx", "*.onnx_data", "*.gguf", "*.tflite")
#: suffixes of the files a config-only resolve fetches
CONFIG_SUFFIXES = (".json", ".yaml", ".yml", ".txt", ".jinja", ".model", ".tiktoken")


class ModelSourceError(ValueError):
    """A model name that does not resolve: not a folder, not in the hub cache offline, an empty bucket
    prefix, an unreachable endpoint. The message is one line naming the model and what to do."""


@dataclass(frozen=True)
class ModelName:
    """A model name, parsed. ``text`` is what the user wrote."""

    text: str
    kind: SourceKind
    location: str  # local: the folder; hub: org/name; s3: s3://bucket/prefix (no trailing slash)
    revision: Optional[str] = None  # hub only: a commit, branch or tag (None: main)
    field: str = "model"  # the config field that named it, for errors (model, decode.draft_model, vqgan_path)

    @property
    def remote(self) -> bool:
        return self.kind != "local"


def parse_model_name(name: str | Path, field: str = "model") -> ModelName:
    """``name`` -> its kind: an existing local path, an ``s3://`` prefix, ``org/name[@revision]``, else a
    local path (which a loader then reports as missing). field: the config field, for errors."""
    text = str(name)
    if text.startswith("s3://"):
        bucket = text[len("s3://"):].split("/", 1)[0]
        if not bucket:
            raise ModelSourceError(f"{field}: {text!r} names no bucket (use s3://bucket/prefix)")
        return ModelName(text, "s3", text.rstrip("/"), field=field)
    if "://" in text:
        raise ModelSourceError(f"{field}: {text!r} has an unsupported scheme (use a local folder, org/name or s3://bucket/prefix)")
    if not isinstance(name, Path) and _HUB_ID.match(text) and not Path(text.split("@", 1)[0]).expanduser().exists():
        repo, _, revision = text.partition("@")
        return ModelName(text, "hub", repo, revision or None, field=field)
    return ModelName(text, "local", str(Path(text).expanduser()), field=field)


def hub_snapshot_of(folder: Path) -> Optional[tuple[str, str]]:
    """(``org/name``, commit) when ``folder`` is a snapshot in a Hugging Face cache, else None."""
    repo_folder = folder.parent.parent
    if folder.parent.name != "snapshots" or not repo_folder.name.startswith("models--"):
        return None
    return repo_folder.name[len("models--"):].replace("--", "/", 1), folder.name


def weight_files_wanted(relative_paths: list[str]) -> list[str]:
    """The files of a checkpoint a loader reads: all of them, less other weight formats when it has
    safetensors (a repository that ships both is fetched in one format)."""
    from fnmatch import fnmatch

    if not any(path.endswith(".safetensors") for path in relative_paths):
        return list(relative_paths)
    return [path for path in relative_paths if not any(fnmatch(Path(path).name, pattern) for pattern in OTHER_WEIGHT_FORMATS)]


def is_config_file(relative_path: str) -> bool:
    """Whether a config-only resolve fetches this file (configs, tokenizer, templates; no weights)."""
    return relative_path.endswith(CONFIG_SUFFIXES)


#: weight files a fingerprint reads (sharded or not)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
_FINGERPRINT_CHUNKS, _FINGERPRINT_CHUNK_BYTES = 16, 1 << 16


def weights_fingerprint(path: str | Path) -> str:
    """A short id of the weight files in ``path`` that changes when the weights do.

    Hashes each file's name, size and 16 evenly spaced 64 KiB chunks (the whole file when it
    is smaller than that), so a 15 GB checkpoint costs ~1 MB of reads per file. Retrained or
    replaced weights change it; a one-byte edit between chunks may not.
    """
    import hashlib

    digest = hashlib.sha256()
    files = sorted({f for pattern in WEIGHT_PATTERNS for f in Path(path).glob(pattern) if f.is_file()})
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        span = _FINGERPRINT_CHUNKS * _FINGERPRINT_CHUNK_BYTES
        offsets = [0] if size <= span else [i * (size - _FINGERPRINT_CHUNK_BYTES) // (_FINGERPRINT_CHUNKS - 1) for i in range(_FINGERPRINT_CHUNKS)]
        with open(file, "rb") as stream:
            for offset in offsets:
                stream.seek(offset)
                digest.update(stream.read(span if size <= span else _FINGERPRINT_CHUNK_BYTES))
    return digest.hexdigest()[:16]


LOCK_WAIT_LOG_S = 30.0


@contextlib.contextmanager
def node_lock(lock_file: Path, parsed: ModelName) -> Iterator[None]:
    """Hold the file lock that lets one process of this node fetch ``parsed`` (the others wait here,
    logging every LOCK_WAIT_LOG_S); the lock is released when its holder exits, however it exits."""
    from filelock import FileLock, Timeout

    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_file))
    while True:
        try:
            lock.acquire(timeout=LOCK_WAIT_LOG_S)
            break
        except Timeout:
            logging.getLogger(__name__).info("%s %s: waiting for another process of this node to finish downloading it",
                                             parsed.field, parsed.text)
    try:
        yield
    finally:
        lock.release()
