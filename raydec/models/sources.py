"""Where a model comes from: a name as users write it, resolved to a folder on this node.

A model is named by one of

    /models/janus-pro-7b                  a local folder saved with save_pretrained (or "reference")
    deepseek-ai/Janus-Pro-7B[@revision]   a Hugging Face hub id: the hub cache, downloaded once per node
    s3://bucket/models/janus-pro-7b/      an S3 prefix: raydec's model cache, downloaded once per node

``model_folder`` resolves a name where the weights are used (each worker, replica or process), into a
node-local cache; ``model_identity`` names the weights without reading them (a hub commit, the
objects' ETags, or for a local folder its weights' fingerprint), for the shape cache, a job's
resume check and its manifest. A local folder that exists wins over a hub id of the same spelling.

    folder = model_folder("s3://bucket/models/tiny-janus", s3=job.input.s3)   # whole, or an error
    identity = model_identity("org/name@v1")                                  # "hub:org/name@<commit>"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from raydec.models.hub_source import hub_folder, hub_identity, snapshot_path
from raydec.models.s3_source import cached_folder, s3_folder, s3_identity
from raydec.models.source_names import (
    SOURCE_RECORD, FileSet, ModelName, ModelSourceError, hub_snapshot_of, parse_model_name, weights_fingerprint,
)

if TYPE_CHECKING:  # the io layer's S3 settings
    from raydec.io.config import S3Config

__all__ = ["ModelName", "ModelSourceError", "describe_source", "folder_identity", "model_folder", "model_identity", "parse_model_name",
           "weights_fingerprint"]


def model_folder(name: str | Path, *, s3: Optional["S3Config"] = None, files: FileSet = "all", field: str = "model") -> Path:
    """The local folder holding ``name``'s files (``files``), fetched into this node's cache when the
    name is remote: once per node (other processes wait on a file lock), whole or not at all.
    field: the config field that named it (errors start with it)."""
    parsed = parse_model_name(name, field)
    if parsed.kind == "local":
        return Path(parsed.location)
    if parsed.kind == "hub":
        return hub_folder(parsed, files=files)
    return s3_folder(parsed, s3=s3, files=files)


def model_identity(name: str | Path, *, s3: Optional["S3Config"] = None, field: str = "model") -> str:
    """What ``name``'s weights are, without reading them: ``hub:org/name@<commit>``, ``s3:<digest of the
    objects' keys, sizes and ETags>``, or a local folder's ``weights_fingerprint``. Changes when the
    weights do."""
    parsed = parse_model_name(name, field)
    if parsed.kind == "hub":
        return hub_identity(parsed)
    if parsed.kind == "s3":
        return s3_identity(parsed, s3=s3)
    return weights_fingerprint(parsed.location)


def folder_identity(folder: str | Path) -> str:
    """The identity of weights already on this node: a bucket copy's recorded identity, a hub
    snapshot's commit, else the folder's ``weights_fingerprint`` (the same strings ``model_identity``
    gives for the name the folder was resolved from)."""
    folder = Path(folder)
    record = folder / SOURCE_RECORD
    if record.is_file():
        return str(json.loads(record.read_text())["identity"])
    hub = hub_snapshot_of(folder)
    if hub is not None:
        return f"hub:{hub[0]}@{hub[1]}"
    return weights_fingerprint(folder)


def describe_source(name: str | Path, *, s3: Optional["S3Config"] = None) -> dict:
    """What a manifest records about a model: its name, kind, resolved revision (identity) and the
    node-local folder it resolves to (the same path on every node with the same cache settings)."""
    parsed = parse_model_name(name)
    if parsed.kind == "local":
        return {"name": parsed.text, "source": "local", "revision": model_identity(name), "path": str(Path(parsed.location).resolve())}
    identity = model_identity(name, s3=s3)
    if parsed.kind == "hub":
        path = snapshot_path(parsed.location, identity.rsplit("@", 1)[1])
    else:
        path = cached_folder(parsed, identity)
    return {"name": parsed.text, "source": parsed.kind, "revision": identity, "path": str(path)}


