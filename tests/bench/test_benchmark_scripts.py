"""The measurement scripts under benchmarks/ run end to end (tiny or small models, a few prompts)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def janus_folder(tmp_path_factory) -> str:
    from tests.tiny_models import build_tiny_janus

    return str(build_tiny_janus(tmp_path_factory.mktemp("janus")))


def test_draft_shapes_counts_forwards_per_shape(janus_folder, monkeypatch, capsys):
    script = _script("draft_shapes")
    monkeypatch.setattr(sys, "argv", ["draft_shapes.py", "--model", janus_folder, "--prompts", "2", "--dtype", "float32", "--by-background", "sjd:8", "sjd_pac:8:2:1"])
    script.main()
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("sjd")]
    split = [line.split() for line in out.splitlines() if "background," in line]  # forwards, compression, name, ...
    assert len(split) >= 2 and sum(int(r[4]) for r in split) == 2 * 2  # every prompt once per shape
    assert all(1.0 <= float(r[1]) <= 9.0 for r in split)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [("sjd", "8", "1", "0"), ("sjd_pac", "8", "2", "1")]
    for row in rows:  # forwards per image, then tokens per forward: at least one token each
        forwards, compression = float(row[4]), float(row[5])
        assert forwards > 0 and 1.0 <= compression <= 9.0
    with pytest.raises(SystemExit):
        monkeypatch.setattr(sys, "argv", ["draft_shapes.py", "eagle:8"])
        script.main()


def test_neighbour_dependence_reports_total_variations(janus_folder, monkeypatch, capsys):
    script = _script("neighbour_dependence")
    monkeypatch.setattr(sys, "argv", ["neighbour_dependence.py", "--model", janus_folder, "--prompts", "2", "--per-image", "2"])
    script.main()
    out = capsys.readouterr().out
    assert "2 AR images, 4 random tokens swapped" in out
    mean = float(re.search(r"all +n= +4 +TV mean (\d\.\d+)", out).group(1))
    assert 0.0 <= mean <= 1.0


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


def test_draft_step_times_both_forms_and_they_agree(monkeypatch, capsys):
    """On the shipped ViSpec draft (a trained img_fc, not [I|0]) the folded decode form gives the
    module's output to float32 rounding."""
    script = _script("draft_step")
    monkeypatch.setattr(sys, "argv", ["draft_step.py", "--rounds", "2", "--calls", "5", "--threads", "1"])
    script.main()
    out = capsys.readouterr().out
    medians = dict(re.findall(r"^(\w+)\s+median\s+([\d.]+) us", out, flags=re.M))
    assert set(medians) == {"forward", "decode_forward"} and all(float(v) > 0 for v in medians.values())
    gap = float(re.search(r"largest output difference ([\d.e+-]+)", out).group(1))
    assert gap < 1e-3, out


def test_profile_decode_writes_stats_for_both_methods(tmp_path, monkeypatch, capsys):
    script = _script("profile_decode")
    argv = ["profile_decode.py", "--device", "cpu", "--images", "1", "--prompts", "1", "--top", "5", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    script.main()
    assert sorted(p.name for p in tmp_path.glob("*.pstats")) == ["caption_ar.pstats", "caption_vispec.pstats", "t2i_ar.pstats", "t2i_sjd_pac.pstats"]
    assert capsys.readouterr().out.count("=====") == 8  # own time and raydec's cumulative, per run


def test_texture_dependence_prints_and_writes_the_table(tmp_path, capsys):
    script = _script("texture_dependence")
    out_json = tmp_path / "textures.json"
    result = script.main(["--betas", "0", "2", "--sequences", "2", "--length", "64", "--window", "16", "--json", str(out_json)])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if re.match(r"\s*\d\.\d\d\s", line)]
    assert [r[0] for r in rows] == ["0.00", "2.00"]
    assert json.loads(out_json.read_text())["textures"] == result["textures"]
    independent, dependent = result["textures"]
    assert independent["neighbour_tv"] == pytest.approx(0.0) and dependent["neighbour_tv"] > 0.5
    for row in result["textures"]:  # at least one token per forward, at most the window
        assert all(1.0 <= v <= 16.0 for v in row["tokens_per_forward"].values())
    with pytest.raises(SystemExit):
        script.main(["--betas", "-1"])
    with pytest.raises(SystemExit):
        script.main(["--levels", "1"])


def test_caption_position_buckets_every_decode_forward(tmp_path, capsys):
    script = _script("caption_position")
    # forwards start at 1, 4, 5 (first answer) and 1 (second): buckets 0-3 and 4-7
    assert script.by_position([[3, 1, 5], [2]], bucket=4) == {0: (2.5, 2), 4: (3.0, 2)}
    out_json = tmp_path / "position.json"
    result = script.main(["--images", "2", "--max-new-tokens", "24", "--json", str(out_json)])
    assert "tokens per forward by answer position: reference, 2 images" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["buckets"] == result["buckets"]
    for row in result["buckets"]:  # a decode forward commits 1 .. depth + 1 tokens
        for method in ("eagle", "vispec"):
            if row[method] is not None:
                assert 1.0 <= row[method]["tokens_per_forward"] <= 7.0 and row[method]["forwards"] >= 1
    with pytest.raises(SystemExit):
        script.main(["--methods", "ar"])


def test_caption_misses_sorts_corrections_and_bounds_a_perfect_image_reader(tmp_path, capsys):
    script = _script("caption_misses")
    # an answer of 10 tokens (position 0: the prefill's); a step committing depth + 1 tokens had no miss
    assert script.miss_positions([3, 7], depth=6, length=10) == [3]  # the 7-token step hit the depth cap
    assert script.miss_positions([2, 2, 5], depth=6, length=10) == [2, 4, 9]
    assert script.replay_forwards(10, {2, 4, 9}, depth=6) == 3
    assert script.replay_forwards(10, set(), depth=6) == 2  # 1-7, then 8-9
    words = ["<bos>", "a", "red", "circle", "on", "a", "grey", "background", ".", "there"]
    table = script.tally([(words, [2, 2, 5])], depth=6)  # misses at "red" (colour), "on", "there" (other)
    assert table["misses"] == {"colour": 1, "other": 2} and table["tokens"]["colour"] == 1
    assert table["forwards"] == table["replayed_forwards"] == 3
    assert table["oracle_forwards"] == script.replay_forwards(10, {4, 9}, depth=6) == 2  # the colour miss repaired
    out_json = tmp_path / "misses.json"
    result = script.main(["--images", "2", "--max-new-tokens", "24", "--json", str(out_json)])
    assert "caption draft misses by word kind: reference, 2 images" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["methods"] == result["methods"]
    for table in result["methods"].values():
        assert table["replayed_forwards"] == table["forwards"] >= table["oracle_forwards"] >= 1
    from raydec.models.registry import REFERENCE_DRAFT_DIRS  # a named draft folder is the one decoded with

    named = script.main(["--images", "2", "--max-new-tokens", "24", "--methods", "eagle", "--eagle-draft",
                         str(REFERENCE_DRAFT_DIRS["eagle"])])
    assert named["methods"]["eagle"] == result["methods"]["eagle"]
    # --simulate decodes nothing: ground-truth answers missed at the saved table's rates
    none_missed = script.simulate(["a red circle ."], {"other": 0.0}, depth=6)
    assert none_missed["ratio"] == 1.0 and none_missed["tokens"] == 5  # 4 words and eos, in one forward
    all_missed = script.simulate(["a red circle ."], {"colour": 1.0, "other": 0.0}, depth=6)
    assert all_missed["tokens_per_forward"] == 2.5 and all_missed["ratio"] == 2.0  # "red" ends the first step
    simulated = script.main(["--simulate", str(out_json), "--images", "4", "--share-sweep", "0.5"])
    assert {"short", "dense"} <= set(simulated) and simulated["dense"]["tokens"] > simulated["short"]["tokens"]
    assert simulated["dense"]["ratio"] >= 1.0 and [row["share"] for row in simulated["share_sweep"]] == [0.5]
    # synthetic answers of 14 tokens: no image-decided token, or every one missed (7 tokens per oracle step)
    none_image, all_image = script.share_sweep(1.0, 0.0, [0.0, 1.0], depth=6, length=15, answers=3)
    assert none_image["ratio"] == 1.0 and none_image["tokens_per_forward"] == 7.0
    assert all_image["tokens_per_forward"] == 1.0 and all_image["ratio"] == 7.0
    with pytest.raises(SystemExit):
        script.main(["--methods", "ar"])
    with pytest.raises(SystemExit):
        script.main(["--depth", "0"])
    with pytest.raises(SystemExit):
        script.main(["--share-sweep", "0.5"])  # replays a saved table's rates: needs --simulate
    with pytest.raises(SystemExit):
        script.main(["--simulate", str(out_json), "--share-sweep", "1.5"])


def test_draft_image_ablation_hides_images_only_inside_its_block(tmp_path, capsys):
    from raydec.models.vispec_draft import VispecDraft

    script = _script("draft_image_ablation")
    original = VispecDraft.build_sequence
    embeds, features = torch.randn(5, 4), torch.randn(5, 4)
    token_image, positions = torch.tensor([-1, 0, 0, -1, -1]), torch.arange(5)
    with script.blind_drafts():
        sequence = VispecDraft.build_sequence(None, embeds, features, token_image, positions)
    assert VispecDraft.build_sequence is original
    assert sequence.positions.tolist() == [0, 3, 4] and torch.equal(sequence.features, features[[0, 3, 4]])
    assert sequence.global_index.tolist() == [-1, -1, -1] and sequence.globals_.shape == (0, 4)
    result = script.main(["--images", "2", "--max-new-tokens", "16", "--json", str(tmp_path / "ablation.json")])
    assert "draft image ablation: reference VLM, 2 images" in capsys.readouterr().out
    for row in result["tokens_per_forward"].values():
        assert 1.0 <= row["blind"] <= 7.0 and 1.0 <= row["sees_image"] <= 7.0


def test_draft_contexts_measures_each_draft_on_greedy_and_sampled_captions(tmp_path, capsys):
    script = _script("draft_contexts")
    result = script.main(["--images", "2", "--max-new-tokens", "12", "--passes", "2", "--threads", "1",
                          "--json", str(tmp_path / "contexts.json")])
    assert "draft contexts: reference, 2 images" in capsys.readouterr().out
    assert json.loads((tmp_path / "contexts.json").read_text())["by_draft"] == result["by_draft"]
    assert set(result["by_draft"]) == {"vispec", "eagle"}
    for by_temperature in result["by_draft"].values():
        assert set(by_temperature) == {"T=0", "T=1"}
        for rows in by_temperature.values():
            assert len(rows) == 2
            for row in rows:
                assert 0 <= row["top1"] <= 1 and 0 <= row["tv"] <= 1
                # P's mass on any K tokens is at most its mass on its own K best
                assert 0 < row["p_on_q_topk"] <= row["p_topk"] + 1e-6 <= 1 + 1e-6


def test_bench_step_reports_every_shape(tmp_path, capsys):
    """``raydec bench step`` at small sizes: one JSON object per shape, one read-back per step."""
    from raydec.bench.cli import main as bench_main

    out = tmp_path / "step.json"
    code = bench_main(["step", "--methods", "sjd_pac,eagle", "--vocab", "512", "--draft-vocab", "512", "--batch", "1,2",
                       "--window", "8", "--steps", "1", "--threads", "1", "--json", str(out)])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert {(r["method"], r["batch"]) for r in runs} == {(m, b) for m in ("sjd_pac", "eagle") for b in (1, 2)}
    for run in runs:
        assert run["syncs_per_step"] <= 2 and run["ops_per_step"] > 0 and run["host_ms_per_step"] >= 0
        assert set(run) >= {"method", "batch", "window", "vocab", "syncs_per_step", "host_bytes_per_step", "ops_per_step", "host_ms_per_step"}
    jacobi = {r["batch"]: r for r in runs if r["method"] == "sjd_pac"}
    assert jacobi[2]["ops_per_step"] <= 1.25 * jacobi[1]["ops_per_step"]  # ops do not grow with the batch
    assert "sjd_pac" in capsys.readouterr().out  # the table
