"""`raydec bench serve` against the running app: a short load, its table and its JSON."""

from __future__ import annotations

import json

from raydec.bench.cli import main as bench_main


def test_bench_serve_reports_the_app_beside_the_in_process_rate(serve_app, tmp_path, capsys):
    path = tmp_path / "serve.json"
    bench_main(["serve", "--url", serve_app["url"], "--model", "t2i", "--api-key", serve_app["key"], "--method", "ar",
                "--concurrency", "2", "--seconds", "4", "--baseline-seconds", "1", "--json", str(path)])
    result = json.loads(path.read_text())
    assert result["errors"] == 0 and result["succeeded"] >= 2
    assert result["requests_per_s"] > 0 and result["in_process"]["rows_per_s"] > 0
    assert result["serve_efficiency"] == result["requests_per_s"] / result["in_process"]["rows_per_s"]
    timed = result["in_process"]  # timed before and after the load, pooled: rows over seconds
    assert min(timed["rows_per_s_before"], timed["rows_per_s_after"]) <= timed["rows_per_s"] <= max(timed["rows_per_s_before"],
                                                                                                     timed["rows_per_s_after"])
    continuous = result["in_process_continuous"]["rows_per_s"]  # the same function with a finished row's place refilled at once
    assert continuous > 0 and result["serve_efficiency_continuous"] == result["requests_per_s"] / continuous
    assert result["latency_p50_s"] <= result["latency_p99_s"]
    assert 1 <= result["mean_batch_size"] <= 2
    assert "serve_efficiency" in capsys.readouterr().out
