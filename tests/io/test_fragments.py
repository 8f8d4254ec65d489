"""Fragments: Parquet row groups planned from footers, CSV / JSON-lines files whole; reading
every fragment gives exactly the rows ``load_rows`` gives, ids derived the same way, locally and
on S3."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raydec.io import InputConfig, check_dataset, load_rows
from raydec.io.fragments import plan_fragments, read_fragment


def _prompts(count: int, with_ids: bool) -> pa.Table:
    columns = {"prompt": [f"a red circle {i}" if i % 7 else "" for i in range(count)]}  # every 7th row is bad
    if with_ids:
        columns = {"id": [f"r{i}" for i in range(count)], **columns}
    return pa.table(columns)


def _read_all(cfg: InputConfig, task: str = "t2i") -> list:
    fragments = plan_fragments(check_dataset(cfg, task), cfg)
    return [row for fragment in fragments for batch in read_fragment(fragment, cfg, task, batch_rows=4) for row in batch]


def test_row_groups_become_fragments_that_read_back_as_load_rows(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(_prompts(25, with_ids=False), folder / "a.parquet", row_group_size=10)  # derived ids a.parquet#i
    pq.write_table(_prompts(5, with_ids=True), folder / "b.parquet")
    (folder / "c.jsonl").write_text("".join(json.dumps({"prompt": f"a blue square {i}"}) + "\n" for i in range(3)))
    cfg = InputConfig(path=str(folder), seed=9)
    fragments = plan_fragments(check_dataset(cfg, "t2i"), cfg)
    shape = [(f.key, f.row_group, f.first_row, f.num_rows) for f in fragments]
    assert shape == [("a.parquet", 0, 0, 10), ("a.parquet", 1, 10, 10), ("a.parquet", 2, 20, 5), ("b.parquet", 0, 0, 5),
                     ("c.jsonl", None, 0, None)]
    assert len(set(fragments)) == len(fragments)  # each fragment its own
    assert fragments[1] == plan_fragments(check_dataset(cfg, "t2i"), cfg)[1]  # stable across plans
    rows = _read_all(cfg)
    assert rows == load_rows(cfg, "t2i")  # same ids, seeds, prompts and errors, in the same order
    assert rows[13]["id"] == "a.parquet#13" and rows[14]["error"] == "prompt: empty"


def test_fragments_on_s3_read_back_as_load_rows(s3_config, s3_bucket):
    fs = pafs.S3FileSystem(endpoint_override=s3_config.endpoint_url.split("://", 1)[1], scheme="http",
                           access_key="testing", secret_key="testing", region="us-east-1")
    with fs.open_output_stream(f"{s3_bucket}/in/p.parquet") as stream:
        pq.write_table(_prompts(12, with_ids=True), stream, row_group_size=5)
    cfg = InputConfig(path=f"s3://{s3_bucket}/in/", s3=s3_config)
    assert [f.num_rows for f in plan_fragments(check_dataset(cfg, "t2i"), cfg)] == [5, 5, 2]
    assert _read_all(cfg) == load_rows(cfg, "t2i")
