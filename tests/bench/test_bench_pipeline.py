"""`raydec bench pipeline` on a tiny real Janus checkpoint: the JSON it returns, no timing thresholds."""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from raydec.bench.pipeline import add_pipeline_parser


@pytest.fixture(scope="module")
def tiny_janus(tmp_path_factory) -> str:
    from tests.tiny_models import build_tiny_janus

    return str(build_tiny_janus(tmp_path_factory.mktemp("tiny_janus")))


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_pipeline_parser(parser.add_subparsers(dest="which", required=True))
    return parser.parse_args(["pipeline", *argv])


def test_bench_pipeline_json(tiny_janus, ray_cluster, tmp_path, capsys):
    """Two batches per side (so a steady state exists), one round; every key present, rates positive."""
    args = _args(["--model", tiny_janus, "--rows", "4", "--batch-size", "2", "--rounds", "1",
                  "--work-dir", str(tmp_path / "work")])
    result = args.bench(args)

    for key in ("pipeline_efficiency", "steady_state_efficiency", "end_to_end_efficiency", "cpu_efficiency",
                "median_batch_efficiency", "rows", "rounds", "direct", "pipeline", "per_round", "breakdown", "config"):
        assert key in result, key
    assert result["rows"] == 4 and result["rounds"] == 1
    assert result["pipeline_efficiency"] == result["steady_state_efficiency"] > 0
    assert result["end_to_end_efficiency"] > 0 and result["median_batch_efficiency"] > 0
    for side in ("direct", "pipeline"):
        assert result[side]["rows_per_s"] > 0
        assert result[side]["end_to_end_rows_per_s"] > 0
        assert result[side]["wall_s"] > 0
        assert result[side]["steady"]["rows"] == 2  # the first batch of 2 is excluded
    breakdown = result["breakdown"]
    assert breakdown["ray_start_s"] >= 0
    assert breakdown["ray_was_running"] is True  # the module's cluster was reused
    assert breakdown["direct_model_load_s"] >= 0
    assert set(breakdown["steady_s_per_row"]) == {"direct", "pipeline", "extra"}
    assert result["config"]["method"] == "ar" and result["config"]["batch_size"] == 2
    assert result["config"]["workers"] == 1
    json.dumps(result)  # JSON-able as written by --json
    # every row was written by the pipeline, with no errors
    from raydec.io import OutputConfig, read_results

    table = read_results(OutputConfig(path=str(tmp_path / "work" / "out_0")))
    assert table.num_rows == 4 and table["error"].null_count == 4
    assert "pipeline_efficiency (steady state)" in capsys.readouterr().out


def test_bench_pipeline_cli_routes_to_pipeline(monkeypatch):
    """`raydec bench pipeline ...` reaches this bench (argument parsing only, nothing runs)."""
    import raydec.bench.cli as bench_cli
    from raydec.cli import main

    seen = {}
    add_parser = bench_cli.add_pipeline_parser

    def patched(subparsers):
        add_parser(subparsers)
        subparsers.choices["pipeline"].set_defaults(bench=lambda args: seen.setdefault("args", args) and {})

    monkeypatch.setattr(bench_cli, "add_pipeline_parser", patched)
    assert main(["bench", "pipeline", "--rows", "3", "--method", "sjd_pac"]) == 0
    assert seen["args"].rows == 3 and seen["args"].method == "sjd_pac"
