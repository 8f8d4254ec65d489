"""`raydec bench serve --rates`: open-loop Poisson load on an app the bench starts from a ServeConfig
file (a tiny Janus), its JSON rows and its plot. The bench starts Serve on the shared Ray cluster
(it starts no Ray of its own when one is up), and the port is picked once that cluster runs, so
its own processes cannot take it first."""

from __future__ import annotations

import json

import pytest
import yaml

from raydec.bench.cli import main as bench_main
from tests.ray_fixture import _free_ports
from tests.t2i_toys import tiny_janus


def test_open_loop_reports_a_row_per_rate_with_ordered_percentiles(ray_cluster, tmp_path, capsys):
    janus = tiny_janus(tmp_path / "janus")
    (port,) = _free_ports(1)
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "api_keys_env": None,
        "models": [{"name": "tiny", "task": "t2i", "model": str(janus), "decode": {"method": "sjd_pac"}, "batch_size": 4,
                    "cpus_per_worker": 0.25}],
    }))
    path, plots = tmp_path / "open.json", tmp_path / "plots"
    bench_main(["serve", "--task", "images", "--config", str(config), "--rates", "2,6", "--requests", "4", "--seconds", "10",
                "--baseline-seconds", "0.5", "--drain-seconds", "30", "--long-prompts", "0.5", "--long-prompt-repeat", "3",
                "--plots", str(plots), "--json", str(path)])
    result = json.loads(path.read_text())
    rows = result["rows"]
    assert [(r["model"], r["rate"]) for r in rows] == [("tiny", 2.0), ("tiny", 6.0)]
    in_process = result["in_process"]["tiny"]
    assert in_process["rows_per_s"] > 0 and in_process["batch"] == 4
    for row in rows:
        assert row["task"] == "images" and row["plan"] == in_process["plan"] and row["plan"].startswith("sjd_pac")
        assert row["follows_batch"] is False and row["steps_per_plan"] is None  # one plan: its shape is not "auto"
        assert row["errors"] == 0 and row["completed"] == row["sent"] == 4
        assert (row["long_prompts"], row["long_repeat"]) == (0.5, 3)  # half the prompts three times over
        assert row["completed_per_s"] > 0 and row["p50_s"] <= row["p90_s"] <= row["p99_s"]
        assert row["ttft_p50_s"] is None and row["gap_p50_s"] is None  # images do not stream
        assert 1 <= row["mean_batch"] <= 4
        assert row["step_count"] >= 1 and 0 < row["step_p50_s"] <= row["step_p99_s"]  # the engine's steps during this load
        assert 0 < row["engine_step_share"] <= 1
        assert row["row_step_p50_s"] >= row["step_p50_s"] * 0.5 and row["row_step_p99_over_p50"] >= 1  # a row waits a step or more
        assert 0 < row["engine_busy"] <= 1 and 0 < row["engine_cpu"] and 0 < row["replica_cpu"]
        assert row["in_process_rate"] == in_process["rows_per_s"]
        assert row["load_share"] == pytest.approx(row["completed_per_s"] / in_process["rows_per_s"])
    assert (plots / "serve_open_loop_images.png").is_file() and result["plot"] == str(plots / "serve_open_loop_images.png")
    assert "open loop" in capsys.readouterr().out


def test_long_prompts_are_spread_over_the_requests():
    from raydec.bench.open_loop import Target

    target = Target("http://127.0.0.1:1", None, "chat", "m", None, [], [], long_share=0.25, long_repeat=3)
    texts = [target.text(number, "describe the image .") for number in range(100)]
    long = [text == " ".join(["describe the image ."] * 3) for text in texts]
    assert 23 <= sum(long) <= 27 and not any(all(long[i:i + 2]) for i in range(99))  # about a quarter, never two in a row
    assert all(text == "describe the image ." for text, is_long in zip(texts, long) if not is_long)


def test_a_row_counts_the_steps_each_plan_ran_during_its_load():
    from raydec.bench.open_loop import Load, Target, _plan, summarise

    target = Target("http://127.0.0.1:1", None, "images", "m", None, ["p"], [])
    plan = {"label": "sjd window=8,init=left"}

    def stats(steps: int, per_plan: dict) -> dict:
        live = {"steps_per_plan": per_plan, "plan_in_use": None, "switches": 0, "patience": 4, "buckets": {}}
        return {"decode_steps": steps, "rows_stepped": 2 * steps, "plan": plan, "live_plan": live}

    load = Load(latencies=[1.0, 2.0], seconds=4.0, sent=2)
    before, after = stats(10, {"sjd window=48,init=left": 10}), stats(25, {"sjd window=48,init=left": 14, "sjd window=8,init=left": 11})
    row = summarise(target, 0.5, load, before, after, in_process=2.0)
    assert row["follows_batch"] is True and row["mean_batch"] == 2.0
    assert row["steps_per_plan"] == {"sjd window=48,init=left": 4, "sjd window=8,init=left": 11}  # only this load's steps
    assert _plan(row) == "follows the batch: sjd window=48,init=left 4 steps, sjd window=8,init=left 11 steps"
    fixed = summarise(target, 0.5, load, {**before, "live_plan": None}, {**after, "live_plan": None}, in_process=2.0)
    assert fixed["follows_batch"] is False and fixed["steps_per_plan"] is None and _plan(fixed) == plan["label"]
