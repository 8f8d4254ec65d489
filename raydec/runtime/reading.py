"""The read stage of a batch job: Ray Data tasks that each read fragments of the input.

    dataset = read_dataset(job, fragments, todo, partial_ref)   # no row ever passes the driver

The driver lists fragments (Parquet row groups from the footers, CSV / JSON-lines files whole)
and makes a Dataset of their descriptions; each read task streams its fragment's validated rows
in blocks of ``pool.batch_size`` rows (bad rows keep their ``error``, so the workers write their
error results), and drops the ids a resume found done (``partial_ref``: an object-store dict of
{fragment index: done ids}, fetched by the tasks, never by the driver).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

import pyarrow as pa
import pyarrow.compute as pc

from raydec.io.config import InputConfig, Task
from raydec.io.fragments import Fragment, fragment_items, fragment_tables
from raydec.runtime.config import JobConfig

READ_ROWS = 1024
"""Rows a read task validates at a time (cut into pool.batch_size blocks after it)."""
READ_TASK_CPUS = 0
"""CPUs a read task reserves: none. Reading is light next to decoding, and a pool whose actors hold
every CPU must not starve its own reads (at most pool.workers + 1 read tasks run at once, one per fragment)."""


def read_fragments(
    batch: pa.Table, *, cfg: InputConfig, task: Task, partial_ref: Optional[list] = None,
) -> Iterator[pa.Table]:
    """map_batches UDF: the validated rows of each fragment in ``batch``, READ_ROWS at a time,
    without the ids in ``partial_ref[0][index]`` (done in an earlier run)."""
    partial: Dict[int, pa.Array] = {}
    if partial_ref:
        import ray

        partial = ray.get(partial_ref[0])
    for item in batch.to_pylist():
        skip = partial.get(item["index"])
        for table in fragment_tables(item, cfg, task, batch_rows=READ_ROWS):
            if skip is not None:
                table = table.filter(pc.invert(pc.is_in(table["id"], value_set=skip)))
            if table.num_rows:
                yield table


def read_dataset(job: JobConfig, fragments: List[Fragment], todo: List[int], partial_ref: Any = None) -> Any:
    """The Dataset of validated rows still to do: one read task per fragment, streamed, cut into
    blocks of ``pool.batch_size`` rows (the unit an actor takes, and redoes after a failure)."""
    import ray.data

    items = fragment_items(fragments, todo)
    return ray.data.from_items(items, override_num_blocks=max(1, len(items))).map_batches(
        read_fragments,
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs=dict(
            cfg=job.input, task=job.task,
            partial_ref=[partial_ref] if partial_ref is not None else None,
        ),
        num_cpus=READ_TASK_CPUS,
        concurrency=max(1, min(job.pool.workers + 1, len(items))),
    ).repartition(target_num_rows_per_block=job.pool.batch_size)  # a read task's outputs would merge into big blocks
