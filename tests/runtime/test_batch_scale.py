"""Batch jobs past one machine's memory: the driver holds no rows and a resume reads no rows.

Each job here stops after its first rows (``max_rows``): what is measured is the way to the
first decoded row, which is where a driver that held the input would grow.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raydec.io import OutputLocation, ResultWriter, error_result, read_manifest, read_results
from raydec.runtime import JobConfig, run_job
from raydec.runtime.pipeline import preflight

MB = 2**20


@pytest.fixture(scope="module")
def tiny_janus(tmp_path_factory) -> str:
    from tests.tiny_models import build_tiny_janus

    return str(build_tiny_janus(tmp_path_factory.mktemp("tiny_janus")))


def write_prompts(folder: Path, rows: int, shards: int) -> Path:
    """``rows`` prompts with ids p0000000..., in ``shards`` Parquet files of several row groups."""
    folder.mkdir(parents=True)
    per_shard = rows // shards
    for shard in range(shards):
        ids = [f"p{shard * per_shard + i:07d}" for i in range(per_shard)]
        prompts = [f"a red circle number {i % 97} ." for i in range(per_shard)]
        pq.write_table(pa.table({"id": ids, "prompt": prompts}), folder / f"part-{shard}.parquet", row_group_size=16_384)
    return folder


def make_job(model: str, input_path: Path, output_path: Path, **extra) -> JobConfig:
    return JobConfig.model_validate(dict(
        task="t2i", model=model, dtype="float32", seed=3,
        input={"path": str(input_path)}, output={"path": str(output_path)},
        decode={"method": "ar"}, pool={"workers": 1, "batch_size": 2, "cpus_per_worker": 0.5}, **extra,
    ))


class PeakRSS:
    """This process's resident memory, sampled every 20 ms while in the ``with`` block."""

    def __enter__(self) -> "PeakRSS":
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.start) / MB


def test_a_200k_row_job_decodes_its_first_rows_without_the_driver_growing(ray_cluster, tiny_janus, tmp_path):
    job = make_job(tiny_janus, write_prompts(tmp_path / "in", 200_000, shards=4), tmp_path / "out", max_rows=4)
    with PeakRSS() as rss:
        report = run_job(job)
    assert report.input_rows == 200_000 and report.processed == 4 and report.missing == 200_000 - 4
    assert report.timings["first_row_s"] > 0
    assert rss.growth_mb <= 200, f"driver grew {rss.growth_mb:.0f} MB on the way to its first rows"
    assert read_results(job.output).num_rows == 4
    manifest = read_manifest(job.output)
    assert manifest["status"] == "incomplete" and manifest["counts"]["missing"] == 200_000 - 4


def test_a_rerun_of_a_job_nine_tenths_done_decodes_its_rest_within_30_s(ray_cluster, tiny_janus, tmp_path):
    """20,000 rows of which 18,000 have results (as a killed run leaves them): the rerun skips them
    by id scan in a Ray task, and its first decoded row is one of the 2,000 left."""
    job = make_job(tiny_janus, write_prompts(tmp_path / "in", 20_000, shards=2), tmp_path / "out", max_rows=2)
    preflight(job)
    from raydec.runtime.pipeline import _manifest
    from raydec.runtime.resume import job_weights

    from raydec.runtime.pipeline import JobReport

    _manifest(OutputLocation(job.output), job, JobReport(output=str(tmp_path / "out")), job_weights(job), status="running")
    done = [f"p{i:07d}" for i in range(0, 20_000) if i % 10 != 7]  # every shard and row group partly done
    with ResultWriter(job.output, worker_id="earlier") as writer:
        for row_id in done:
            writer.add(error_result({"id": row_id, "prompt": "x", "seed": 0}, "ar", "an earlier run's row"))
    started = time.perf_counter()
    report = run_job(job)
    assert report.skipped_completed == 18_000 and report.processed == 2
    assert report.timings["first_row_s"] <= 30, report.timings
    assert time.perf_counter() - started < 60
    new = [row for row in read_results(job.output).to_pylist() if row["error"] is None]
    assert len(new) == 2 and all(int(row["id"][1:]) % 10 == 7 for row in new)
