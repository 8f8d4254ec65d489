"""The actor class Ray Data's actor pool runs: one model per actor, durable results per batch.

Each call takes a batch of validated rows, runs the job's row decoder on the good ones,
writes images and one result shard with a `ResultWriter` named after this actor, and
returns a small summary (id, error, worker) for the driver's progress accounting. Because
the shard is written before the call returns, a batch is either durable or redone.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Dict, List

import pyarrow as pa

from raydec.io import ResultWriter, error_result
from raydec.runtime.config import JobConfig
from raydec.runtime.row_decoders import failed_result, make_row_decoder

logger = logging.getLogger(__name__)

SUMMARY_SCHEMA = pa.schema([
    pa.field("id", pa.string()),
    pa.field("error", pa.string()),
    pa.field("worker", pa.string()),
    pa.field("target_forwards", pa.int64()),
    pa.field("tokens", pa.int64()),
    pa.field("latency_s", pa.float64()),
    pa.field("invalid", pa.bool_()),  # the row failed validation (in the read task), not decoding
    pa.field("node", pa.string()),  # the Ray node the actor runs on
])
"""What each actor call returns to the driver: one row per processed input row."""


def node_id() -> str:
    """The Ray node id of this process (its first 12 hex digits), or "local" outside Ray."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id()[:12]
    except Exception:
        return "local"


def worker_id() -> str:
    """A unique writer id for this process: the Ray actor id (when in an actor) plus a random suffix."""
    suffix = uuid.uuid4().hex[:8]
    try:
        import ray

        actor_id = ray.get_runtime_context().get_actor_id()
    except Exception:  # outside Ray (unit use): the suffix alone is unique enough
        actor_id = None
    return f"{actor_id[:16]}_{suffix}" if actor_id else f"local_{suffix}"


def is_device_failure(exc: BaseException) -> bool:
    """An accelerator failure (out of memory, a device-side assert, a lost device): it says nothing
    about the rows, so it must not become their error results (a resume would skip them)."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError) or type(exc).__name__ == "AcceleratorError":
        return True
    return isinstance(exc, RuntimeError) and any(word in str(exc) for word in ("CUDA error", "CUDA out of memory", "cuDNN error"))


class GenerationWorker:
    """Callable class for `Dataset.map_batches`: loads the model in `__init__`, once per actor."""

    def __init__(self, job: JobConfig) -> None:
        self.job = job
        self.decoder = make_row_decoder(job.processor_config())
        self.decoder.setup()
        self.worker_id = worker_id()
        self.node = node_id()
        self.writer = ResultWriter(job.output, worker_id=self.worker_id)
        logger.info("worker %s ready (pid %d)", self.worker_id, os.getpid())

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        good = [row for row in rows if not row.get("error")]
        results: List[Dict[str, Any]] = [error_result(row, self.decoder.method) for row in rows if row.get("error")]
        invalid = {result["id"] for result in results}
        if good:
            results += self._process(good)
        summary = [dict(self._write(result), invalid=result["id"] in invalid) for result in results]
        self.writer.flush()
        return pa.Table.from_pylist(summary, schema=SUMMARY_SCHEMA)

    def _process(self, rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Row decoder results for good rows; a decoder crash becomes error rows, not a lost batch."""
        try:
            results = self.decoder(rows)
        except Exception as exc:
            if is_device_failure(exc):  # not the rows' fault: fail the batch so Ray retries it, record nothing
                logger.error("worker %s: device failure on a batch of %d row(s): %s", self.worker_id, len(rows), exc)
                raise
            logger.exception("worker %s: batch of %d row(s) failed", self.worker_id, len(rows))
            return [failed_result(row, self.decoder.method, f"{type(exc).__name__}: {exc}") for row in rows]
        missing = {row["id"] for row in rows} - {result["id"] for result in results}
        by_id = {row["id"]: row for row in rows}
        return results + [failed_result(by_id[i], self.decoder.method, "the row decoder returned no result") for i in missing]

    def _write(self, result: Dict[str, Any]) -> Dict[str, Any]:
        """Write the result's image (if any), buffer its row; returns the summary row."""
        result = dict(result)
        image = result.pop("image", None)
        if image is not None and not result.get("error"):
            # An output failure fails the batch (and the job) rather than marking the row:
            # a re-run then redoes it, while an error row would count as done.
            result["output_uri"] = self.writer.write_image(result["id"], image)
        self.writer.add(result)
        return dict(
            id=result["id"], error=result.get("error"), worker=self.worker_id, node=self.node,
            target_forwards=int(result.get("target_forwards") or 0), tokens=int(result.get("tokens") or 0),
            latency_s=float(result.get("latency_s") or 0.0),
        )
