"""An input split into fragments that read tasks take one each, so no process holds every row.

    fragments = plan_fragments(files, cfg)                  # Parquet footers only: no row data
    for batch in read_fragment(fragments[0], cfg, "t2i"):   # in a worker: validated rows
        ...

A Parquet file gives one fragment per row group (its row count and first row index come from
the footer); a CSV or JSON-lines file is one fragment (row count unknown until read). Reading a
fragment yields the rows ``load_rows`` would give for it, validated the same way, with ids
derived from the file key and row index where the input has none, so a row's id and seed do
not depend on which task read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from raydec.io.config import InputConfig, IOConfigError, Task
from raydec.io.datasets import InputFile, read_rows
from raydec.io.filesystem import resolve_filesystem
from raydec.io.validation import validate_caption_rows, validate_t2i_rows


@dataclass(frozen=True)
class Fragment:
    """A slice of one input file: a Parquet row group, or a whole CSV / JSON-lines file."""

    uri: str
    key: str  # the file relative to the input root (derived ids are key#row)
    format: str
    row_group: Optional[int]  # None: the whole file
    first_row: int  # the file's index of the fragment's first row
    num_rows: Optional[int]  # from the Parquet footer; None for CSV / JSON lines


def plan_fragments(files: List[InputFile], cfg: InputConfig) -> List[Fragment]:
    """The fragments of ``files``, in file then row order; reads Parquet footers only."""
    fragments: List[Fragment] = []
    for file in files:
        if file.format != "parquet":
            fragments.append(Fragment(file.uri, file.key, file.format, None, 0, None))
            continue
        fs, path = resolve_filesystem(file.uri, cfg.s3)
        try:
            with fs.open_input_file(path) as stream:
                metadata = pq.ParquetFile(stream).metadata
        except (OSError, pa.ArrowInvalid) as exc:
            raise IOConfigError(f"input: cannot read {file.uri} as parquet: {exc}") from None
        first = 0
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            fragments.append(Fragment(file.uri, file.key, "parquet", group, first, rows))
            first += rows
    return fragments


def read_fragment(fragment: Fragment, cfg: InputConfig, task: Task, batch_rows: int = 1024) -> Iterator[List[Dict[str, Any]]]:
    """The fragment's validated rows, at most ``batch_rows`` at a time (a Parquet row group is
    streamed by record batch)."""
    validate = validate_t2i_rows if task == "t2i" else validate_caption_rows
    for first, rows in _raw_rows(fragment, cfg, batch_rows):
        yield validate(rows, cfg, file_key=fragment.key, first_row_index=first)


def _raw_rows(fragment: Fragment, cfg: InputConfig, batch_rows: int) -> Iterator[tuple[int, List[Dict[str, Any]]]]:
    """(file row index of the first, rows) chunks of the fragment, unvalidated."""
    if fragment.row_group is None:
        rows = read_rows(InputFile(fragment.uri, fragment.key, fragment.format), cfg)
        for start in range(0, len(rows), batch_rows):
            yield start, rows[start : start + batch_rows]
        return
    fs, path = resolve_filesystem(fragment.uri, cfg.s3)
    try:
        with fs.open_input_file(path) as stream:
            first = fragment.first_row
            for record_batch in pq.ParquetFile(stream).iter_batches(batch_size=batch_rows, row_groups=[fragment.row_group]):
                yield first, record_batch.to_pylist()
                first += record_batch.num_rows
    except (OSError, pa.ArrowInvalid) as exc:
        raise IOConfigError(f"input: cannot read row group {fragment.row_group} of {fragment.uri}: {exc}") from None


ROW_SCHEMAS = {
    "t2i": pa.schema([
        ("id", pa.string()), ("source", pa.string()), ("prompt", pa.string()), ("negative_prompt", pa.string()),
        ("seed", pa.int64()), ("error", pa.string()),
    ]),
    "caption": pa.schema([
        ("id", pa.string()), ("source", pa.string()), ("prompt", pa.string()), ("image", pa.binary()),
        ("image_uri", pa.string()), ("seed", pa.int64()), ("error", pa.string()),
    ]),
}
"""The validated rows of a task as tables (one schema per task, so every block agrees)."""


def fragment_items(fragments: List[Fragment], todo: List[int]) -> List[Dict[str, Any]]:
    """Dataset items describing the fragments ``todo``: each fragment's fields and its index."""
    return [{"index": index, **asdict(fragments[index])} for index in todo]


def fragment_tables(item: Dict[str, Any], cfg: InputConfig, task: Task, batch_rows: int = 1024) -> Iterator[pa.Table]:
    """A ``fragment_items`` item's validated rows as tables of ``ROW_SCHEMAS[task]``, at most
    ``batch_rows`` rows each."""
    fields = {k: v for k, v in item.items() if k != "index"}
    schema = ROW_SCHEMAS[task]
    for rows in read_fragment(Fragment(**fields), cfg, task, batch_rows=batch_rows):
        yield pa.Table.from_pylist([{name: row.get(name) for name in schema.names} for row in rows], schema=schema)
