"""A Hugging Face hub cache as the hub client lays it out, built from local folders: tests reach hub ids
through it with ``HF_HUB_OFFLINE=1``, never through a hub."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def hub_layout(cache: Path, repo_id: str, snapshots: dict[str, Path], main: str) -> None:
    """``cache`` as the hub client leaves it: ``models--org--name/snapshots/<commit>/`` per snapshot
    (blobs linked into it) and ``refs/main`` naming ``main``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    for commit, folder in snapshots.items():
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                blob = repo / "blobs" / f"{commit[:8]}-{path.relative_to(folder).as_posix().replace('/', '_')}"
                blob.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, blob)
                link = repo / "snapshots" / commit / path.relative_to(folder)
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(main)
