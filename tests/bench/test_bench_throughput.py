"""`raydec bench throughput` on a tiny real Janus, and its frontier on hand-made rows."""

from __future__ import annotations

import json

import pytest
import torch

from raydec.bench.cli import main as bench_main
from raydec.bench.throughput import MIN_BATCHES, frontier

torch.set_num_threads(1)


@pytest.mark.parametrize("batching", ["continuous", "consecutive"])  # consecutive: the configs take turns batch by batch
def test_bench_throughput_rows_auto_choices_and_frontier(tmp_path, batching):
    from tests.t2i_toys import tiny_janus

    model = tiny_janus(tmp_path / "janus")
    out = tmp_path / "throughput.json"
    couplings = ["rejection", "gumbel"] if batching == "continuous" else ["rejection"]  # side by side, each tuned
    assert bench_main(["throughput", "--task", "t2i", "--model", str(model), "--batches", "1,2", "--items", "2", "--calibration", "2",
                       "--rounds", "1", "--repeats", "1", "--dtype", "float32", "--batching", batching, "--plots", str(tmp_path / "plots"),
                       "--couplings", ",".join(couplings), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    for batch in (1, 2):
        at = [r for r in rows if r["batch"] == batch]
        assert {r["shape"] for r in at if r["method"] == "ar"} == {"ar"}
        for coupling in couplings:
            auto = [r for r in at if r["method"] == "sjd_pac" and r["auto"] and r["coupling"] == coupling]
            assert len(auto) == 1  # the tuned choice, which may be plain AR
            chosen = next(t["chosen"] for t in result["tuning"] if t["batch"] == batch and t["coupling"] == coupling)
            assert auto[0]["shape"] == chosen
        assert all(r["items_per_s"] > 0 and r["kv_bytes"] > 0 and r["tokens_per_forward"] >= 1.0 for r in at)
        assert all(r["items"] == max(2, MIN_BATCHES * batch) for r in at)  # every config decoded every measured row
    assert all(0 < r["occupancy"] <= 1 if batching == "continuous" else r["occupancy"] is None for r in rows)
    assert result["frontier_ratio"] == result["frontier"]["frontier_ratio"] > 0
    assert (tmp_path / "plots" / "throughput_t2i.png").is_file()


def test_the_frontier_compares_each_methods_best_batch_within_the_memory_budget():
    def row(method, batch, items_per_s, kv_bytes, auto=True, shape="window=16"):
        return {"method": method, "batch": batch, "shape": "ar" if method == "ar" else shape, "auto": auto,
                "items_per_s": items_per_s, "kv_bytes": kv_bytes}

    rows = [row("ar", 1, 1.0, 10), row("ar", 8, 4.0, 80), row("ar", 32, 6.0, 320),
            row("sjd_pac", 1, 3.0, 11), row("sjd_pac", 8, 5.0, 90), row("sjd_pac", 8, 9.0, 90, auto=False, shape="window=48"),
            row("sjd_pac", 32, 6.5, 350)]
    everything = frontier(rows, None)
    assert everything["frontier_ratio"] == 6.5 / 6.0  # AR at its best batch (32), the tuned shapes only
    tight = frontier(rows, 100)  # batch 32 does not fit: AR's best is batch 8
    assert tight["frontier_ratio"] == 5.0 / 4.0 and tight["best_ar"]["batch"] == 8
