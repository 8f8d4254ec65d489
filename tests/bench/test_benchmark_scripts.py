"""The measurement scripts under benchmarks/ run end to end (tiny or small models, a few prompts)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_host_work_reports_host_ms_per_step(monkeypatch, capsys, tmp_path):
    script = _script("host_work")
    out_json = tmp_path / "host.json"
    monkeypatch.setattr(sys, "argv", ["host_work.py", "--codebook", "512", "--batch", "2", "--window", "8", "--repeats", "1",
                                      "--json", str(out_json)])
    script.main()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result == json.loads(out_json.read_text())
    assert result["steps"] > 0 and result["host_ms_per_step"] > 0 and (result["batch"], result["window"]) == (2, 8)
    assert Path(result["raydec"]) == Path(__import__("raydec").__file__).parent  # it names the code it measured


def test_profile_decode_writes_stats_for_both_methods(tmp_path, monkeypatch, capsys):
    script = _script("profile_decode")
    argv = ["profile_decode.py", "--device", "cpu", "--images", "1", "--prompts", "1", "--top", "5", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    script.main()
    assert sorted(p.name for p in tmp_path.glob("*.pstats")) == ["caption_ar.pstats", "caption_vispec.pstats", "t2i_ar.pstats", "t2i_sjd_pac.pstats"]
    assert capsys.readouterr().out.count("=====") == 8  # own time and raydec's cumulative, per run


def test_bench_step_reports_every_shape(tmp_path, capsys):
    """``raydec bench step`` at small sizes: one JSON object per shape, one read-back per step; the
    draft tree over a small Qwen2 with grouped queries and a ViSpec draft (the Qwen2.5-VL-7B stage's classes)."""
    from raydec.bench.cli import main as bench_main

    out = tmp_path / "step.json"
    code = bench_main(["step", "--methods", "sjd_pac,eagle", "--vocab", "512", "--draft-vocab", "512", "--batch", "1,2",
                       "--window", "8", "--steps", "1", "--threads", "1", "--tree-target", "qwen2.5-vl-small", "--coupling", "rejection,gumbel",
                       "--json", str(out)])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert {(r["method"], r["batch"], r["coupling"]) for r in runs} == {
        (m, b, c) for m in ("sjd_pac", "eagle") for b in (1, 2) for c in ("rejection", "gumbel")}
    for run in runs:
        assert run["syncs_per_step"] <= 2 and run["ops_per_step"] > 0 and run["host_ms_per_step"] >= 0
        assert set(run) >= {"method", "batch", "window", "vocab", "syncs_per_step", "host_bytes_per_step", "ops_per_step", "host_ms_per_step",
                            "launches_per_step", "compile"}
        assert 0 < run["launches_per_step"] < run["ops_per_step"]  # views and allocations launch nothing
    assert all(r["target"] == "qwen2.5-vl-small" and r["step_over_forward"] > 1 for r in runs if r["method"] == "eagle")
    for coupling in ("rejection", "gumbel"):
        jacobi = {r["batch"]: r for r in runs if r["method"] == "sjd_pac" and r["coupling"] == coupling}
        assert jacobi[2]["ops_per_step"] <= 1.25 * jacobi[1]["ops_per_step"]  # ops do not grow with the batch
    assert "sjd_pac" in capsys.readouterr().out  # the table


def test_gpu_check_dry_runs_its_stages_on_the_cpu(tmp_path):
    """``benchmarks/gpu_check.sh`` with ``DEVICE=cpu``: the prepared GPU run's plumbing (stage
    selection, limits, the bench's JSON per stage) on the CPU, two stages at tiny sizes."""
    import os
    import subprocess

    env = {**os.environ, "DEVICE": "cpu", "PY": sys.executable, "STAGES": "step engine_7b",
           "STEP_ARGS": "--methods sjd_pac --vocab 512 --batch 1 --window 8 --steps 1 --threads 1"}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), str(tmp_path), "0.05"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "=== step: exit 0" in done.stdout and "=== engine_7b: exit 0" in done.stdout and "=== done" in done.stdout, done.stdout
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["engine_7b.json", "step.json"]  # the stages asked for, no others
    (run,) = json.loads((tmp_path / "step.json").read_text())["runs"]
    assert (run["method"], run["batch"], run["window"]) == ("sjd_pac", 1, 8) and run["launches_per_step"] > 0
    assert json.loads((tmp_path / "engine_7b.json").read_text())["engine_efficiency"] > 0


def test_gpu_checks_default_stages_fit_one_device_call_and_their_commands_parse(tmp_path):
    """``PLAN=1 benchmarks/gpu_check.sh``: the default stages, most informative first (the captured
    step at batch 8, the 7B oracle engine, t2i and captions against AR at batches 1 and 8, the
    frontier), their limits adding up to one device call (540 s at most); each stage's command, on
    the GPU and on the CPU, parses with ``raydec bench``'s own parser."""
    import os
    import shlex
    import subprocess

    from raydec.bench.cli import build_parser

    for device in ("cuda", "cpu"):
        env = {**os.environ, "PLAN": "1", "DEVICE": device, "PY": sys.executable}
        env.pop("STAGES", None)
        done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), str(tmp_path)], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        plan = [line.split(" ", 3) for line in done.stdout.splitlines() if line.startswith("plan ")]
        assert [name for _, name, _, _ in plan] == ["step_captured", "engine_7b_captured", "t2i_b1", "t2i_b8", "caption_t1",
                                                    "caption_b8", "throughput_t2i", "throughput_caption"]
        assert sum(int(limit) for _, _, limit, _ in plan) <= 540
        for _, name, _, command in plan:
            words = shlex.split(command)
            assert words[:2] == ["raydec", "bench"], command
            args = build_parser().parse_args(words[2:])  # exits (SystemExit) on an argument the bench does not take
            assert args.device == device and str(args.json).endswith(f"{name}.json")
        assert not list(tmp_path.glob("*.json"))  # a plan runs nothing


def test_random_janus_saves_a_checkpoint_raydec_check_passes_on_in_bfloat16(tmp_path, monkeypatch, capsys):
    """gpu_check.sh's stage check_7b at the small shape: the random Janus loads by path, and every row of sjd_pac in
    bfloat16 is AR's or differs at a numeric near-tie."""
    import torch

    from raydec.api.check import check_identity

    script = _script("random_janus")
    monkeypatch.setattr(sys, "argv", ["random_janus.py", "--size", "small", "--codebook", "256", "--out", str(tmp_path / "janus")])
    script.main()
    assert "image head x" in capsys.readouterr().out
    report = check_identity(["a red circle", "two blue squares"], model=str(tmp_path / "janus"), decode={"method": "sjd_pac"},
                            dtype=torch.bfloat16, warmup=False)
    assert report.passed and report.ar.tokens_per_forward == 1.0, report.table()


def test_tie_rounding_measures_each_dtype_against_float64(tmp_path, monkeypatch, capsys):
    script = _script("tie_rounding")
    out = tmp_path / "ties.json"
    monkeypatch.setattr(sys, "argv", ["tie_rounding.py", "--task", "caption", "--rows", "1", "--max-new-tokens", "6", "--dtypes", "bfloat16",
                                      "--json", str(out)])
    script.main()
    figures = json.loads(out.read_text())["dtypes"]["bfloat16"]
    assert figures["positions"] > 0 and 0 <= figures["median"] <= figures["max"]
    assert "caption bfloat16: positions" in capsys.readouterr().out
