"""Models named by Hugging Face hub id: ``org/name[@revision]``, through the hub's own cache.

The cache is the hub's (``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``)::

    models--org--name/refs/main                 the commit a branch or tag names
    models--org--name/snapshots/<commit>/       the files of that commit

One process of a node downloads a snapshot (a file lock beside the cache); the hub client writes each
file aside and renames it. A snapshot is used only when it holds its weights (every shard an index
names), so an interrupted or config-only download is fetched again, or named in the error offline.
With ``HF_HUB_OFFLINE=1`` (or no network) a cached id loads from the cache; an uncached one is a
one-line error naming the id and the cache folder.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from raydec.models.source_names import (
    CONFIG_SUFFIXES, FileSet, ModelName, ModelSourceError, node_lock, weight_files_wanted,
)

logger = logging.getLogger(__name__)

_TRUE = {"1", "true", "yes", "on"}


def hub_cache() -> Path:
    """The hub cache folder this process reads (its environment now, not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as set now."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def snapshot_path(repo_id: str, commit: str) -> Path:
    return hub_cache() / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit


def cached_commit(parsed: ModelName) -> str | None:
    """The commit the cache holds for ``parsed``'s revision (a commit hash, or a branch / tag in refs/), or None."""
    repo_folder = hub_cache() / f"models--{parsed.location.replace('/', '--')}"
    revision = parsed.revision or "main"
    if (repo_folder / "snapshots" / revision).is_dir():
        return revision
    ref = repo_folder / "refs" / revision
    return ref.read_text().strip() if ref.is_file() else None


def _not_cached(parsed: ModelName, why: str) -> ModelSourceError:
    return ModelSourceError(
        f"{parsed.field}: {parsed.text!r} (no folder of that name here) is not in the Hugging Face cache at {hub_cache()} and {why}; download it once where the hub "
        f"is reachable (hf download {parsed.location}{' --revision ' + parsed.revision if parsed.revision else ''}) or name a "
        "local folder"
    )


def hub_identity(parsed: ModelName) -> str:
    """``hub:org/name@<commit>``: the cache's commit offline, the hub's answer online."""
    return f"hub:{parsed.location}@{_commit(parsed)}"


def _commit(parsed: ModelName) -> str:
    cached = cached_commit(parsed)
    if hub_offline():
        if cached is None:
            raise _not_cached(parsed, "the hub is off (HF_HUB_OFFLINE=1)")
        return cached
    try:
        return str(_api().model_info(parsed.location, revision=parsed.revision).sha)
    except Exception as error:  # noqa: BLE001 - any failure to ask the hub falls back to the cache
        if cached is not None:
            logger.warning("model %s: the hub did not answer (%s); using the cached commit %s", parsed.text, error, cached)
            return cached
        raise _not_cached(parsed, f"the hub cannot be asked ({type(error).__name__}: {error})") from None


def _api():
    from huggingface_hub import HfApi

    return HfApi()


def missing_weights(folder: Path) -> list[str]:
    """Weight files a checkpoint folder lacks: the shards its index names, or any weight file at all."""
    missing: list[str] = []
    for index in folder.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError):
            return [index.name]
        missing += sorted(shard for shard in shards if not (folder / shard).is_file())
    if missing or any(folder.glob("*.index.json")):
        return missing
    has_weights = any(folder.glob(pattern) for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt"))
    return [] if has_weights else ["weights (*.safetensors)"]


def hub_folder(parsed: ModelName, files: FileSet = "all") -> Path:
    """The snapshot folder of ``parsed`` in the hub cache, downloaded once per node when it is not whole there."""
    commit = _commit(parsed)
    folder = snapshot_path(parsed.location, commit)
    if folder.is_dir() and (files == "config" or not missing_weights(folder)):
        return folder
    if hub_offline():
        if not folder.is_dir():
            raise _not_cached(parsed, "the hub is off (HF_HUB_OFFLINE=1)")
        raise ModelSourceError(f"{parsed.field}: {parsed.text!r}: the cached snapshot {folder} lacks {', '.join(missing_weights(folder))} "
                               "(an interrupted download) and the hub is off (HF_HUB_OFFLINE=1)")
    return _download(parsed, commit, files)


def _download(parsed: ModelName, commit: str, files: FileSet) -> Path:
    from huggingface_hub import snapshot_download

    lock_file = hub_cache() / ".locks" / "raydec" / f"models--{parsed.location.replace('/', '--')}.lock"
    try:
        with node_lock(lock_file, parsed):
            return _download_locked(parsed, commit, files, snapshot_download)
    except ModelSourceError:
        raise
    except Exception as error:  # noqa: BLE001 - a hub or disk failure is the user's to see in one line
        raise ModelSourceError(f"{parsed.field}: {parsed.text!r}: downloading commit {commit} from the hub failed "
                               f"({type(error).__name__}: {error})") from None


def _download_locked(parsed: ModelName, commit: str, files: FileSet, snapshot_download) -> Path:
    """The download itself, under the node's lock (a process that waited finds the snapshot whole)."""
    folder = snapshot_path(parsed.location, commit)
    if folder.is_dir() and (files == "config" or not missing_weights(folder)):
        return folder
    names = [sibling.rfilename for sibling in _api().model_info(parsed.location, revision=commit).siblings or []]
    wanted = weight_files_wanted(names) if files == "all" else [name for name in names if name.endswith(CONFIG_SUFFIXES)]
    skipped = len(names) - len(wanted)
    logger.info("%s %s: downloading %d file(s) of commit %s into %s%s", parsed.field, parsed.text, len(wanted), commit, hub_cache(),
                f" (not {skipped} other: another weight format, or weights for a config-only read)" if skipped else "")
    path = snapshot_download(parsed.location, revision=commit, cache_dir=str(hub_cache()), allow_patterns=wanted or None,
                             tqdm_class=None if sys.stderr.isatty() else _quiet_tqdm())
    return Path(path)


def _quiet_tqdm():
    """A progress bar class that logs nothing (workers log a line per download instead of bars)."""
    from tqdm.auto import tqdm

    class Quiet(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Quiet
