"""The draft shapes worth trying for a method (``candidate_configs``), and the tuned choices kept on
disk, one per (model weights, device, dtype, threads, batch, config) (:class:`ShapeCache`,
``target_shape_key``). ``raydec.api.plan.plan_decode`` is what chooses, with the tuner
(``raydec.api.tuner``)."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any, Sequence

from raydec.api.tuner import ShapeTrial, shape_label
from raydec.config import DRAFT_METHODS, JACOBI_METHODS, DecodeConfig, DraftTreeConfig, JacobiDraftConfig, full_tree_nodes
from raydec.models.sources import folder_identity, model_identity, parse_model_name

logger = logging.getLogger(__name__)

WINDOWS: tuple[int, ...] = (8, 16, 32, 48)  # SJD windows tried (L - 1)
PAC_TREES: tuple[tuple[int, int], ...] = ((1, 0), (3, 1))  # (K, D - 1) for sjd_pac: a chain and the default tree
DRAFT_TREES: tuple[tuple[int, int, int], ...] = ((3, 2, 6), (6, 2, 12), (6, 3, 20), (8, 4, 32))  # (depth, top_k, total_tokens)
AUTO_INITS: tuple[str, ...] = ("uniform", "left")  # fresh-draft priors tried when the whole draft is "auto"


def candidate_configs(
    base: DecodeConfig,
    windows: Sequence[int] = WINDOWS,
    pac_trees: Sequence[tuple[int, int]] = PAC_TREES,
    draft_trees: Sequence[tuple[int, int, int]] = DRAFT_TREES,
) -> list[DecodeConfig]:
    """Plain AR, then every shape of ``base.method`` worth trying (its prior, sampling and draft kept)."""
    ar = base.model_copy(update={"method": "ar", "jacobi": JacobiDraftConfig(), "draft_tree": None})
    if base.method == "ar":
        return [ar]
    shapes: list[DecodeConfig] = []
    if base.method in JACOBI_METHODS:
        trees = pac_trees if base.method == "sjd_pac" else [(1, 0)]
        template = JacobiDraftConfig() if base.jacobi == "auto" else base.jacobi
        inits = AUTO_INITS if base.jacobi == "auto" else (template.init,)
        for init, window, (branching, depth) in itertools.product(inits, windows, trees):
            if branching > 1 and full_tree_nodes(branching, depth) >= window:
                continue  # the tree does not fit the window
            jacobi = JacobiDraftConfig(**{**template.model_dump(), "window": window, "branching": branching, "tree_depth": depth, "init": init})
            shapes.append(base.model_copy(update={"jacobi": jacobi}))
    elif base.method in DRAFT_METHODS:
        for depth, top_k, total in draft_trees:
            shapes.append(base.model_copy(update={"draft_tree": DraftTreeConfig(depth=depth, top_k=top_k, total_tokens=total)}))
    else:
        raise ValueError(f"method={base.method!r}: no draft shape to choose")
    return [ar, *shapes]


# -- the choice, once per model, device and batch ------------------------------------------------


def shape_record(config: DecodeConfig) -> dict:
    """What a tuned choice records (a manifest's ``shape``, a cache entry): the method it decodes
    with ("ar" when speculation did not pay) and its concrete draft or tree."""
    return {
        "method": config.method,
        "jacobi": config.jacobi.model_dump() if config.method in JACOBI_METHODS else None,
        "draft_tree": config.tree.model_dump() if config.method in DRAFT_METHODS else None,
        "label": shape_label(config),
    }


def apply_shape(base: DecodeConfig, record: dict) -> DecodeConfig:
    """``base`` decoding with a recorded choice (its method may become "ar"). A record of an earlier
    release names the Jacobi shape ``draft``."""
    jacobi = record.get("jacobi") or record.get("draft")
    return base.model_copy(update={
        "method": record["method"],
        "jacobi": JacobiDraftConfig.model_validate(jacobi) if jacobi else JacobiDraftConfig(),
        "draft_tree": DraftTreeConfig.model_validate(record["draft_tree"]) if record.get("draft_tree") else None,
    })


def device_name(device: Any) -> str:
    """The device a timing belongs to: the GPU's name, or the CPU's model and torch's thread count."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu {model} x{torch.get_num_threads()} threads"


def cache_folder() -> Path:
    """Where tuned shapes are kept: ``$RAYDEC_CACHE_DIR/shapes``, else ``~/.cache/raydec/shapes``."""
    root = os.environ.get("RAYDEC_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "raydec") / "shapes"


def key_digest(key: dict) -> str:
    """A short digest of a shape cache key: its file's name."""
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]


class ShapeCache:
    """Tuned shapes on disk, one JSON file per key (the key's hash names it; the key is kept inside)."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else cache_folder()

    def _path(self, key: dict) -> Path:
        return self.folder / f"{key_digest(key)}.json"

    def get(self, key: dict) -> dict | None:
        try:
            entry = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        return entry.get("shape") if entry.get("key") == json.loads(json.dumps(key, default=str)) else None

    def put(self, key: dict, record: dict, trials: Sequence[ShapeTrial] = ()) -> Path | None:
        """Keep ``record`` under ``key`` (written whole, then renamed); an unwritable folder only logs."""
        path = self._path(key)
        entry = {"key": key, "shape": record,
                 "trials": [{"shape": shape_label(t.config), "rows_per_s": t.rows_per_s, "ratio_to_ar": t.ratio_to_ar, "captured": t.captured}
                            for t in trials]}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(entry, indent=2, default=str))
            partial.replace(path)
        except OSError as exc:
            logger.warning("shape cache %s is not writable (%s): the next run tunes again", self.folder, exc)
            return None
        return path

    def best_batch(self, key: dict) -> int | None:
        """Of the batches tuned for ``key`` at any batch size (the same weights, device, dtype and
        config), the one whose choice decoded the most rows per second; None when none was tuned."""
        wanted = {k: v for k, v in json.loads(json.dumps(key, default=str)).items() if k != "batch"}
        best: tuple[float, int] | None = None
        for path in sorted(self.folder.glob("*.json")):
            try:
                entry = json.loads(path.read_text())
                other = entry["key"]
                if {k: v for k, v in other.items() if k != "batch"} != wanted:
                    continue
                label = entry["shape"]["label"]
                rate = max(float(t["rows_per_s"]) for t in entry.get("trials", []) if t.get("shape") == label)
                batch = int(other["batch"])
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # unreadable, another key, or no timing of its choice
            if best is None or (rate, -batch) > (best[0], -best[1]):
                best = (rate, batch)
        return None if best is None else best[1]


def shape_key(base: DecodeConfig, weights: str, device: str, dtype: str, batch: int) -> dict:
    """What a tuned choice depends on: the weights, the device, the dtype, the batch and the rest of the
    config (its length included: an image size's layout, a caption's cap)."""
    config = base.model_dump(mode="json", exclude={"jacobi", "draft_tree"})
    return {"weights": weights, "device": device, "dtype": dtype, "batch": batch, "config": config}


def weights_id(target: Any, draft_folder: str | Path | None = None) -> str | None:
    """The weights a tuned shape belongs to, ``model:<identity>`` (and ``+draft:<identity>`` of the
    draft model's folder, first: roles sorted; ``sources.folder_identity``: a local folder's fingerprint,
    a hub snapshot's commit, a bucket copy's ETag digest); None when the target was not loaded from a
    folder (nothing identifies its weights)."""
    folder = getattr(getattr(target, "model", None), "name_or_path", None)
    if not folder or not Path(folder).is_dir():
        return None
    parts = {"model": folder_identity(folder)}
    if draft_folder is not None and Path(draft_folder).is_dir():
        parts["draft"] = folder_identity(draft_folder)
    elif draft_folder is not None and parse_model_name(draft_folder).remote:  # a hub id or s3:// draft, by name
        parts["draft"] = model_identity(draft_folder, field="decode.draft_model")
    return "+".join(f"{role}:{fingerprint}" for role, fingerprint in sorted(parts.items()))


def target_shape_key(config: DecodeConfig, target: Any, batch: int, draft_folder: str | Path | None = None) -> dict | None:
    """The shape cache's key for decoding ``config`` (as resolved for ``target``: its sampling and
    length filled in) on ``target`` at ``batch``, the same for a public function, a job and a Serve
    replica; None when nothing identifies the weights (:func:`weights_id`)."""
    weights = weights_id(target, draft_folder)
    dtype = str(target.dtype).removeprefix("torch.")
    return shape_key(config, weights, device_name(target.device), dtype, batch) if weights else None
