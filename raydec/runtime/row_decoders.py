"""Row decoders: what one worker actor does to a batch of validated rows.

A row decoder loads its model once per actor in `setup()` and turns a batch of good rows
(validated dicts, no `error`) into result rows (`raydec.io.RESULT_SCHEMA` keys). A result
row may carry an `image` (a PIL image) that the worker writes and replaces by its URI.
Row decoders hold no decoding logic: they call `raydec.api`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Protocol, runtime_checkable

from raydec.api import DEFAULT_CAPTION_PROMPT, caption_images, draft_dtype, generate_images, load_draft_model, load_target, sized
from raydec.config import DRAFT_METHODS
from raydec.io import attach_caption_images, error_result
from raydec.models.sources import model_folder
from raydec.runtime.config import ProcessorConfig

logger = logging.getLogger(__name__)


@runtime_checkable
class RowDecoder(Protocol):
    """Loads models once (`setup`) and maps a batch of good rows to result rows."""

    method: str

    def setup(self) -> None:
        """Load models; called once per actor before the first batch."""

    def __call__(self, batch: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Result rows for `batch`, one per row, in any order."""


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def worker_device(config: ProcessorConfig) -> str:
    """'cuda' when Ray gave this actor a GPU (it then sets CUDA_VISIBLE_DEVICES to it) and torch
    sees one, else 'cpu'. A GPU torch can see but Ray did not assign is never used: another
    actor may own it."""
    import torch

    if config.gpus_per_worker <= 0:
        return "cpu"
    assigned = assigned_gpu_ids()
    if assigned and torch.cuda.is_available():
        return "cuda"
    logger.warning(
        "gpus_per_worker=%s but this actor has no GPU (Ray assigned %s, torch sees %d): running on CPU",
        config.gpus_per_worker, assigned or "none", torch.cuda.device_count(),
    )
    return "cpu"


def assigned_gpu_ids() -> list:
    """The GPU ids Ray assigned to the current worker ([] outside Ray or without a GPU)."""
    try:
        import ray

        return list(ray.get_gpu_ids()) if ray.is_initialized() else []
    except Exception:  # not in a Ray worker
        return []


class ImageRowDecoder:
    """Text-to-image rows -> images and decoding statistics, via `raydec.api.generate_images`."""

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config
        self.method = config.decode.method
        self.target: Any = None

    def setup(self) -> None:
        import torch

        torch.set_num_threads(self.config.threads)
        target = load_target(model=self.config.model, task="t2i", dtype=_torch_dtype(self.config.dtype), device=worker_device(self.config),
                             vqgan_path=self.config.vqgan_path, s3=self.config.rows.s3)
        self.target = sized(target, self.config.size)
        logger.info("t2i row decoder: loaded %s (%s, method %s)", self.config.model, self.config.dtype, self.method)

    def _generate(self, rows: List[Dict[str, Any]]) -> List[Any]:
        negatives = [row.get("negative_prompt") for row in rows]
        return generate_images(
            [row["prompt"] for row in rows],
            model=self.target,
            decode=self.config.decode,
            seeds=[int(row["seed"]) for row in rows],
            negative_prompts=negatives if any(n is not None for n in negatives) else None,
            batch_size=self.config.batch_size,
        )

    def _result(self, row: Dict[str, Any], image_result: Any) -> Dict[str, Any]:
        return dict(
            id=row["id"], source=row.get("source") or row["prompt"], prompt=row["prompt"], seed=int(row["seed"]),
            method=self.method, image=image_result.image,
            target_forwards=int(image_result.target_forwards), tokens=int(image_result.num_tokens),
            tokens_per_forward=float(image_result.tokens_per_forward), latency_s=float(image_result.latency_s),
        )

    def __call__(self, batch: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        return run_rows(batch, self._generate, self._result, self.method, "generation")


def run_rows(
    rows: List[Dict[str, Any]], run: Callable[[List[Dict[str, Any]]], List[Any]],
    to_result: Callable[[Dict[str, Any], Any], Dict[str, Any]], method: str, stage: str,
) -> List[Dict[str, Any]]:
    """Result rows of ``run`` over ``rows`` as one batch; if the batch fails, row by row, so one
    bad row becomes an error row (``"<stage>: <error>"``) instead of failing its batch."""
    if not rows:
        return []
    try:
        return [to_result(row, out) for row, out in zip(rows, run(rows), strict=True)]
    except Exception as exc:
        if len(rows) > 1:
            logger.warning("%s of a batch of %d failed (%s); retrying row by row", stage, len(rows), exc)
    results = []
    for row in rows:
        try:
            results.append(to_result(row, run([row])[0]))
        except Exception as exc:
            logger.warning("%s of row %r failed: %s", stage, row["id"], exc)
            results.append(failed_result(row, method, f"{stage}: {type(exc).__name__}: {exc}"))
    return results


def failed_result(row: Dict[str, Any], method: str, error: str) -> Dict[str, Any]:
    """A result row for `row` that failed with `error` (no model output)."""
    return error_result(row, method, error)


class CaptionRowDecoder:
    """Captioning rows -> captions and decoding statistics, via `raydec.api.caption_images`.

    Images are decoded (inline bytes) or fetched (local path or s3:// URI) here, in the
    actor; a corrupt or missing image becomes that row's `error` and the batch goes on.
    """

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config
        self.method = config.decode.method
        self.target: Any = None

    def setup(self) -> None:
        import torch

        torch.set_num_threads(self.config.threads)
        self.target = load_target(model=self.config.model, task="caption", dtype=_torch_dtype(self.config.dtype), device=worker_device(self.config),
                                  s3=self.config.rows.s3)
        self.decode = self.config.decode
        if self.method in DRAFT_METHODS:  # load the draft model once, now, so a bad path fails here
            if self.decode.draft_model is not None:  # a hub id or s3:// draft decodes from its copy on this node
                folder = model_folder(self.decode.draft_model, s3=self.config.rows.s3, field="decode.draft_model")
                self.decode = self.decode.model_copy(update={"draft_model": str(folder)})
            dtype = draft_dtype(self.target, self.decode.draft_dtype)
            load_draft_model(self.target, self.method, self.config.model, self.decode.draft_model, dtype=dtype)
        logger.info("caption row decoder: loaded %s (%s, method %s)", self.config.model, self.config.dtype, self.method)

    def _caption(self, rows: List[Dict[str, Any]]) -> List[Any]:
        return caption_images(
            [row["pil_image"] for row in rows],
            prompt=[row.get("prompt") or DEFAULT_CAPTION_PROMPT for row in rows],
            model=self.target,
            decode=self.decode,
            seeds=[int(row["seed"]) for row in rows],
            batch_size=self.config.batch_size,
        )

    def _result(self, row: Dict[str, Any], caption: Any) -> Dict[str, Any]:
        return dict(
            id=row["id"], source=row["source"], prompt=row.get("prompt"), seed=int(row["seed"]),
            method=self.method, caption=caption.caption,
            target_forwards=int(caption.target_forwards), tokens=int(caption.num_tokens),
            tokens_per_forward=float(caption.tokens_per_forward), latency_s=float(caption.latency_s),
        )

    def __call__(self, batch: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        rows = attach_caption_images(batch, self.config.rows.s3, max_pixels=self.config.rows.max_image_pixels)
        results = [failed_result(row, self.method, row["error"]) for row in rows if row.get("error")]
        good = [row for row in rows if not row.get("error")]
        return results + run_rows(good, self._caption, self._result, self.method, "captioning")


ROW_DECODERS: Dict[str, Callable[[ProcessorConfig], RowDecoder]] = {"t2i": ImageRowDecoder, "caption": CaptionRowDecoder}
"""RowDecoder per task."""


def make_row_decoder(config: ProcessorConfig) -> RowDecoder:
    """The row decoder for `config.task`; raises ValueError naming the task when none is registered."""
    if config.task not in ROW_DECODERS:
        raise ValueError(f"task: {config.task!r} has no row decoder in this build (available: {sorted(ROW_DECODERS)})")
    return ROW_DECODERS[config.task](config)
