"""Which input ids a job's output already holds, read as Arrow columns, never as rows.

    scan = scan_ids(fragments, cfg, task, output, include_errors=True)

reads only the id column of each input fragment (Parquet: that column of one row group; an input
without ids: none, the ids derive from the file key and row index) and the id and error columns
of the result shards, and answers, per fragment, how many rows are done, the done ids of the
fragments only partly done (what a resume filters on), and how many input ids have no result.
It raises DuplicateIdError when two input rows share an id. Memory is that of the id columns
(about 130 bytes per id at its peak, measured on 2 million ids); run it where that is cheap (a Ray
task), not in a job's driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raydec.io.config import InputConfig, IOConfigError, OutputConfig, Task
from raydec.io.fragments import Fragment, read_fragment
from raydec.io.filesystem import resolve_filesystem
from raydec.io.validation import derive_row_id, row_id
from raydec.io.writers import read_shards

MISSING_SAMPLE = 100
"""How many missing ids a scan names (the count is always exact)."""


class DuplicateIdError(IOConfigError):
    """Two input rows share an id: a job must write exactly one result per id."""


@dataclass
class IdScan:
    """Per-fragment row and done counts of an input against an output, and what is missing."""

    rows: List[int]  # [fragments] input rows of each fragment
    done: List[int]  # [fragments] of those, rows whose id has a result (as include_errors counts)
    results: int = 0  # input ids with a result of any kind
    result_errors: int = 0  # input ids whose only results are errors
    missing: int = 0  # input ids without any result
    missing_sample: List[str] = field(default_factory=list)  # the first MISSING_SAMPLE of them, sorted

    @property
    def input_rows(self) -> int:
        return sum(self.rows)

    @property
    def todo(self) -> List[int]:
        """Indices of the fragments with rows left to do."""
        return [i for i, (rows, done) in enumerate(zip(self.rows, self.done)) if done < rows]


def fragment_ids(fragment: Fragment, cfg: InputConfig, task: Task) -> pa.Array:
    """The validated ids of one fragment's rows, in row order (as ``read_fragment`` gives them)."""
    if fragment.row_group is None:  # CSV / JSON lines: the row count and ids need the whole file
        return pa.array([row["id"] for rows in read_fragment(fragment, cfg, task) for row in rows], pa.string())
    fs, path = resolve_filesystem(fragment.uri, cfg.s3)
    try:
        with fs.open_input_file(path) as stream:
            parquet = pq.ParquetFile(stream)
            if cfg.id_column not in parquet.schema_arrow.names:
                return pa.array([derive_row_id(fragment.key, fragment.first_row + i) for i in range(fragment.num_rows or 0)],
                                pa.string())
            values = parquet.read_row_group(fragment.row_group, columns=[cfg.id_column]).column(0).to_pylist()
    except (OSError, pa.ArrowInvalid) as exc:
        raise IOConfigError(f"input: cannot read row group {fragment.row_group} of {fragment.uri}: {exc}") from None
    return pa.array([row_id(value, fragment.key, fragment.first_row + i) for i, value in enumerate(values)], pa.string())


def result_ids(output: OutputConfig) -> tuple[pa.Array, pa.Array]:
    """(ids with any result, ids with a result without error), each distinct."""
    table = read_shards(output, ["id", "error"])
    any_result = pc.unique(table["id"].combine_chunks())
    ok = pc.unique(table.filter(pc.is_null(table["error"]))["id"].combine_chunks())
    return any_result, ok


def _check_unique(fragments: List[Fragment], ids: List[pa.Array]) -> None:
    """Raise DuplicateIdError naming the first repeated id and two rows that hold it."""
    every = pa.chunked_array(ids, pa.string())
    if pc.count_distinct(every).as_py() == len(every):
        return
    counts = pc.value_counts(every)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")[0].as_py()
    places = []
    for fragment, fragment_ids_ in zip(fragments, ids):
        for offset in pc.indices_nonzero(pc.equal(fragment_ids_, repeated)).to_pylist():
            places.append(f"{fragment.key} row {fragment.first_row + offset}")
    raise DuplicateIdError(
        f"input: id {repeated!r} appears twice ({places[0]} and {places[1]}); ids must be unique"
    )


def scan_ids(
    fragments: List[Fragment], cfg: InputConfig, task: Task, output: OutputConfig, include_errors: bool = True,
) -> tuple[IdScan, Dict[int, pa.Array]]:
    """(the scan, {fragment index: its done ids} for the fragments partly done).

    ``include_errors=False`` counts a row whose only results are errors as not done (a retry).
    """
    ids = [fragment_ids(fragment, cfg, task) for fragment in fragments]
    _check_unique(fragments, ids)
    any_result, ok = result_ids(output)
    done_set = any_result if include_errors else ok
    scan = IdScan(rows=[len(a) for a in ids], done=[])
    partial: Dict[int, pa.Array] = {}
    missing: List[pa.Array] = []
    for index, fragment_ids_ in enumerate(ids):
        done = pc.is_in(fragment_ids_, value_set=done_set)
        has_any = done if include_errors else pc.is_in(fragment_ids_, value_set=any_result)
        has_ok = pc.is_in(fragment_ids_, value_set=ok)
        count = pc.sum(done).as_py() or 0
        scan.done.append(count)
        if 0 < count < len(fragment_ids_):
            partial[index] = fragment_ids_.filter(done)
        scan.results += pc.sum(has_any).as_py() or 0
        scan.result_errors += pc.sum(pc.and_(has_any, pc.invert(has_ok))).as_py() or 0
        missing.append(fragment_ids_.filter(pc.invert(has_any)))
    lacking = pa.chunked_array(missing, pa.string())
    scan.missing = len(lacking)
    if scan.missing:  # the smallest MISSING_SAMPLE, without sorting them all
        first = pc.select_k_unstable(pa.table({"id": lacking}), k=min(MISSING_SAMPLE, scan.missing),
                                     sort_keys=[("id", "ascending")])  # indices
        scan.missing_sample = sorted(pc.take(lacking, first).to_pylist())
    return scan, partial

