"""Job results: PNG images and Parquet result shards, written and read back under an output
location (``storage.OutputLocation``, which also keeps the layout and the manifest); the manifest
read and written by an output's config or path.

Shards appear atomically (see `storage`), so on restart `completed_ids` sees only whole
shards, and `read_results` returns exactly one row per id even if a crash-retry wrote a
row twice.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Set, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel

from raydec.io.config import OutputConfig
from raydec.io.images import ImageLike, encode_png
from raydec.io.storage import IMAGES_DIR, RESULTS_DIR, SHARD_NAME, OutputLocation, as_output

logger = logging.getLogger(__name__)

__all__ = [
    "RESULT_SCHEMA", "ResultWriter", "completed_ids", "error_result", "image_key", "normalise_result", "read_manifest",
    "read_results", "read_shards", "write_manifest",
]

RESULT_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),  # the prompt, or the image URI
    pa.field("prompt", pa.string()),
    pa.field("seed", pa.int64(), nullable=False),
    pa.field("output_uri", pa.string()),  # the written image (text-to-image)
    pa.field("caption", pa.string()),  # the generated text (captioning)
    pa.field("method", pa.string(), nullable=False),
    pa.field("target_forwards", pa.int64(), nullable=False),
    pa.field("tokens", pa.int64(), nullable=False),
    pa.field("tokens_per_forward", pa.float64(), nullable=False),
    pa.field("latency_s", pa.float64(), nullable=False),
    pa.field("error", pa.string()),
])
"""One row per input row: what was asked, what came out, and how decoding went."""

_REQUIRED = ("id", "source", "seed", "method")
_DEFAULTS: Dict[str, Any] = dict(
    prompt=None, output_uri=None, caption=None, target_forwards=0, tokens=0,
    tokens_per_forward=0.0, latency_s=0.0, error=None,
)


def image_key(row_id: str) -> str:
    """A file-name-safe stem for a row id; ids that need escaping get a short hash suffix."""
    if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,119}", row_id):
        return row_id
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", row_id)[:100].lstrip(".") or "id"
    return f"{cleaned}-{hashlib.blake2b(row_id.encode('utf-8'), digest_size=4).hexdigest()}"


def normalise_result(row: Mapping[str, Any]) -> Dict[str, Any]:
    """Check a result row's keys and fill defaults; raises ValueError naming the key."""
    unknown = sorted(set(row) - set(RESULT_SCHEMA.names))
    if unknown:
        raise ValueError(f"result row {row.get('id')!r}: unknown key(s) {unknown}; expected {RESULT_SCHEMA.names}")
    missing = [key for key in _REQUIRED if row.get(key) is None]
    if missing:
        raise ValueError(f"result row {row.get('id')!r}: missing required key(s) {missing}")
    return {name: row.get(name, _DEFAULTS.get(name)) for name in RESULT_SCHEMA.names}


def error_result(row: Mapping[str, Any], method: str, error: Optional[str] = None) -> Dict[str, Any]:
    """The result row for a validated input row that failed (its own `error`, or `error`)."""
    return normalise_result(dict(
        id=row["id"], source=row.get("source") or "", prompt=row.get("prompt"), seed=row["seed"],
        method=method, error=error or row.get("error") or "unknown error",
    ))


class ResultWriter:
    """Writes one worker's images and result shards under an output location.

    Rows are buffered and flushed as `part-{worker}-{seq}.parquet` every
    `output.shard_size` rows and on `close()`. Each worker of a job needs its own
    `worker_id`; a restarted worker continues after its highest existing shard number.
    Use as a context manager so buffered rows are flushed even when the job fails.
    """

    def __init__(self, output: OutputConfig, worker_id: Union[str, int] = "0") -> None:
        self.output = output
        self.location = OutputLocation(output)
        self.worker_id = re.sub(r"[^A-Za-z0-9_.]+", "_", str(worker_id))
        self._buffer: List[Dict[str, Any]] = []
        self._next_seq = self._first_free_seq()
        self.rows_written = 0
        self.shards_written: List[str] = []

    def _first_free_seq(self) -> int:
        seqs = [int(m["seq"]) for m in map(SHARD_NAME.match, self.location.shard_names())
                if m and m["worker"] == self.worker_id]
        return max(seqs, default=-1) + 1

    def image_uri(self, row_id: str) -> str:
        """Where the image of `row_id` goes."""
        return self.location.uri_of(f"{IMAGES_DIR}/{image_key(row_id)}.{self.output.image_format}")

    def write_image(self, row_id: str, image: Union[ImageLike, bytes]) -> str:
        """Encode (unless already bytes) and write the image of `row_id`; returns its URI."""
        data = bytes(image) if isinstance(image, (bytes, bytearray)) else encode_png(image)
        return self.location.put(f"{IMAGES_DIR}/{image_key(row_id)}.{self.output.image_format}", data, "image/png")

    def add(self, row: Mapping[str, Any]) -> None:
        """Buffer one result row (see RESULT_SCHEMA); flushes a shard when the buffer is full."""
        self._buffer.append(normalise_result(row))
        if len(self._buffer) >= self.output.shard_size:
            self.flush()

    def flush(self) -> Optional[str]:
        """Write buffered rows as one shard; returns its URI, or None if nothing was buffered."""
        if not self._buffer:
            return None
        try:
            table = pa.Table.from_pylist(self._buffer, schema=RESULT_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise ValueError(f"result rows do not match RESULT_SCHEMA: {exc}") from None
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        name = f"part-{self.worker_id}-{self._next_seq:05d}.parquet"
        uri = self.location.put(f"{RESULTS_DIR}/{name}", sink.getvalue())
        logger.info("wrote %d result row(s) to %s", table.num_rows, uri)
        self._next_seq += 1
        self.rows_written += table.num_rows
        self.shards_written.append(uri)
        self._buffer = []
        return uri

    def close(self) -> None:
        """Flush what is buffered."""
        self.flush()

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


LEGACY_COLUMNS = {"tokens_per_forward": "mean_accepted"}
"""Result columns renamed since: current name -> the name shards written before carry."""


def read_shards(output: OutputConfig, columns: Optional[List[str]] = None) -> pa.Table:
    """Concatenate the finished result shards (only ``columns``; None: all), each row tagged with its
    shard and row order (columns ``_shard``, ``_row``); unreadable shards are skipped with a warning."""
    location = OutputLocation(output)
    names = location.shard_names()
    columns = columns or RESULT_SCHEMA.names
    schema = pa.schema([RESULT_SCHEMA.field(c) for c in columns])

    def read_one(name: str) -> Optional[pa.Table]:
        fs, path = location.fs, location.path_of(f"{RESULTS_DIR}/{name}")
        try:
            stored = pq.read_schema(path, filesystem=fs).names
            renamed = {old: new for new, old in LEGACY_COLUMNS.items() if new in columns and new not in stored and old in stored}
            wanted = [next((old for old, new in renamed.items() if new == c), c) for c in columns]
            table = pq.read_table(path, filesystem=fs, columns=wanted).select(wanted).rename_columns(columns)
            return table.cast(schema)
        except (OSError, pa.ArrowInvalid, KeyError) as exc:
            logger.warning("skipping unreadable result shard %s: %s", location.uri_of(f"{RESULTS_DIR}/{name}"), exc)
            return None

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
        tables = list(pool.map(read_one, names))
    parts = []
    for shard_index, table in enumerate(tables):
        if table is None:
            continue
        table = table.append_column("_shard", pa.array([shard_index] * table.num_rows, pa.int64()))
        parts.append(table.append_column("_row", pa.array(range(table.num_rows), pa.int64())))
    if not parts:
        empty = schema.append(pa.field("_shard", pa.int64())).append(pa.field("_row", pa.int64()))
        return empty.empty_table()
    return pa.concat_tables(parts)


def completed_ids(output: OutputConfig, include_errors: bool = True) -> Set[str]:
    """Ids that already have a result row, so a restarted job can skip them.

    With `include_errors=False`, rows that only have a failed result are retried; the
    retry's success then wins in `read_results`.
    """
    table = read_shards(output, ["id", "error"])
    if not include_errors:
        table = table.filter(pc.is_null(table["error"]))
    return set(table["id"].to_pylist())


def read_results(output: Union[OutputConfig, str, "os.PathLike[str]"]) -> pa.Table:
    """All results of a job's output (its OutputConfig or path), one row per id, sorted by id.

    When an id appears more than once (a shard rewritten by a crash-retry, or a retried
    error), the kept row is the first without an error, else the first, in shard order.
    """
    table = read_shards(as_output(output))
    if table.num_rows == 0:
        return table.drop_columns(["_shard", "_row"])
    table = table.append_column("_failed", pc.is_valid(table["error"]))
    table = table.sort_by([(name, "ascending") for name in ("id", "_failed", "_shard", "_row")])
    ids = table["id"].combine_chunks()
    first_of_id = pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))
    keep = pa.concat_arrays([pa.array([True]), first_of_id.fill_null(True)])
    deduped = table.filter(keep).drop_columns(["_shard", "_row", "_failed"])
    if deduped.num_rows < table.num_rows:
        logger.info("read_results: dropped %d duplicate row(s)", table.num_rows - deduped.num_rows)
    return deduped


def write_manifest(
    output: OutputConfig,
    config: Union[BaseModel, Mapping[str, Any]],
    counts: Mapping[str, int],
    timings: Mapping[str, float],
    extra: Optional[Mapping[str, Any]] = None,
) -> str:
    """Write OUTPUT/manifest.json (``OutputLocation.write_manifest``); returns its URI."""
    return OutputLocation(output).write_manifest(config, counts, timings, extra)


def read_manifest(output: Union[OutputConfig, str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """The parsed OUTPUT/manifest.json (of an OutputConfig or a path)."""
    return OutputLocation(as_output(output)).read_manifest()
