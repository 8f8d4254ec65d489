"""`raydec bench t2i` wiring on a tiny real Janus, and the judge-score agreement test."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from raydec.bench.cli import main as bench_main
from raydec.bench.t2i import score_agreement

torch.set_num_threads(1)


def test_score_agreement_passes_same_law_and_fails_a_shift():
    rng = np.random.default_rng(0)
    a, b = rng.beta(2, 5, 200).tolist(), rng.beta(2, 5, 200).tolist()
    same = score_agreement(a, b)
    assert same["judge_same_distribution"] and abs(same["judge_mean_diff"]) < 0.05
    shifted = score_agreement(a, (np.asarray(b) + 0.1).tolist())
    assert not shifted["judge_same_distribution"] and shifted["judge_mean_diff"] > 0.09


def test_bench_t2i_runs_every_method_on_a_tiny_janus(tmp_path):
    from tests.tiny_models import build_tiny_janus

    model = build_tiny_janus(tmp_path / "janus")
    out = tmp_path / "t2i.json"
    code = bench_main(["t2i", "--model", str(model), "--methods", "ar,hf,sjd,sjd_pac", "--prompts", "2", "--dtype", "float32",
                       "--window", "8", "--branching", "2", "--tree-depth", "1", "--plots", str(tmp_path / "plots"), "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["methods"]) == {"ar", "hf", "sjd", "sjd_pac"}
    for name, entry in result["methods"].items():
        assert entry["step_compression"] > 0 and entry["latency_speedup"] > 0 and 0 <= entry["judge_score"] <= 1
        assert name == "ar" or "judge_ks_p" in entry
    assert result["methods"]["sjd_pac"]["tokens_per_forward"] >= 1.0
    assert all((tmp_path / "plots").joinpath(p.split("/")[-1]).exists() for p in result["plots"])
    # --init auto (the default) with a fixed window: each Jacobi method's prior is chosen at that window
    priors = {p["method"]: p for p in result["fresh_drafts"]}
    assert set(priors) == {"sjd", "sjd_pac"}
    for name, prior in priors.items():
        assert prior["probe"]["window"] == 8 and set(prior["steps_per_batch"]) == {"uniform", "left", "above"}
        assert prior["chosen"] == min(prior["steps_per_batch"], key=prior["steps_per_batch"].get)
        assert result["config"][name]["jacobi"]["init"] == prior["chosen"] and result["config"][name]["jacobi"]["window"] == 8
    assert (result["config"]["sjd_pac"]["jacobi"]["branching"], result["config"]["sjd_pac"]["jacobi"]["tree_depth"]) == (2, 1)


def test_candidate_shapes_skip_trees_that_do_not_fit():
    from raydec.bench.cost_tuner import candidate_shapes

    chains = candidate_shapes("sjd_ac", windows=(4, 16))
    assert [(s.window, s.branching, s.tree_depth) for s in chains] == [(4, 1, 0), (16, 1, 0)]
    trees = candidate_shapes("sjd_pac", windows=(4, 16), trees=((2, 1), (3, 2)))
    # a 3-ary tree of depth 2 has 12 nodes: it fits 16 but not 4
    assert [(s.window, s.branching, s.tree_depth) for s in trees] == [(4, 2, 1), (16, 2, 1), (16, 3, 2)]


def test_tune_draft_follows_the_cost_curve(tmp_path):
    """Flat costs (a GPU) reward the widest window; costs growing like the window (a slow
    CPU) make every wide window a loss, so the narrowest wins."""
    from raydec.api import load_target
    from raydec.bench.cost_tuner import tune_draft
    from tests.tiny_models import build_tiny_janus

    target = load_target(build_tiny_janus(tmp_path / "janus"), "t2i", dtype=torch.float32)
    sampling = target.default_sampling()
    args = dict(prompts=["a red circle", "a blue square"], seeds=[0, 1], sampling=sampling, windows=(2, 8))
    args["inits"] = ("uniform",)  # the prior's choice has its own test
    flat = {1: 1.0, 3: 1.0, 9: 1.0}
    best, tried = tune_draft(target, "sjd", costs=flat, **args)
    assert [t.jacobi.window for t in tried] == [2, 8]
    assert tried[1].steps_per_batch < tried[0].steps_per_batch  # a wider window never needs more steps here
    assert best.jacobi.window == 8
    linear = {1: 1.0, 3: 3.0, 9: 9.0}
    best, tried = tune_draft(target, "sjd", costs=linear, **args)
    assert best.jacobi.window == 2 and all(t.predicted_speedup < 1.0 for t in tried)
    # timed: whole steps are timed; predictions follow N * step(ar) / (steps * step(c))
    best, tried = tune_draft(target, "sjd", costs=linear, one_token_seconds=1e-3, ar_step=2.0, **args)
    for t in tried:
        assert t.step_cost > 0
        assert t.predicted_speedup == pytest.approx(target.num_image_tokens * 2.0 / (t.steps_per_batch * t.step_cost))
    assert best.predicted_speedup == max(t.predicted_speedup for t in tried)


def test_a_tree_replaces_the_chain_only_past_the_calibration_noise():
    from raydec.config import JacobiDraftConfig
    from raydec.bench.cost_tuner import TunedShape, tree_beats_chain

    def shape(branching: int, depth: int, speedup: float) -> TunedShape:
        return TunedShape("sjd_pac", JacobiDraftConfig(window=32, branching=branching, tree_depth=depth), 30.0, 1.5, speedup)

    chain, tree = shape(1, 0, 4.65), shape(3, 1, 5.13)  # a 10% predicted lead
    steady = [30, 31, 29, 30], [27, 28, 26, 27]  # chain's, tree's forwards per row: the same ~10% on every row
    assert tree_beats_chain(tree, chain, steady[1], steady[0])
    noisy = [30, 31, 29, 30], [20, 38, 24, 35]  # the same mean lead, one row against it: noise
    assert not tree_beats_chain(tree, chain, noisy[1], noisy[0])
    assert not tree_beats_chain(tree, chain, [27], [30])  # one row: the noise is unknown
    assert not tree_beats_chain(shape(3, 1, 4.0), chain, steady[1], steady[0])  # predicted behind


def test_fit_step_costs_is_monotone_in_window_and_tree_size():
    from raydec.bench.cost_tuner import fit_step_costs

    assert fit_step_costs([(9, 0), (17, 0), (33, 0)], [3.0, 5.0, 9.0]) == pytest.approx([3.0, 5.0, 9.0])  # already monotone
    # a busy spell made window 8 look as dear as 48: the two are pooled, 32 in between with them
    assert fit_step_costs([(9, 2), (33, 2), (49, 2)], [8.0, 4.0, 6.0]) == pytest.approx([6.0, 6.0, 6.0])
    assert fit_step_costs([(9, 0), (9, 0)], [2.0, 4.0]) == pytest.approx([3.0, 3.0])  # one shape: the mean
    # a grid: non-decreasing along windows (same tree) and along trees (same window)
    shapes = [(w, t) for w in (9, 17, 33) for t in (0, 2, 12)]
    generator = np.random.default_rng(3)
    noisy = [w / 8 + t / 12 + float(generator.normal(0, 0.6)) for w, t in shapes]
    fitted = dict(zip(shapes, fit_step_costs(shapes, noisy)))
    for (w, t), value in fitted.items():
        for (w2, t2), other in fitted.items():
            if w <= w2 and t <= t2:
                assert value <= other + 1e-9, ((w, t), (w2, t2))
    assert min(noisy) - 1e-9 <= min(fitted.values()) and max(fitted.values()) <= max(noisy) + 1e-9
    # the least-squares monotone fit: no monotone vector is closer to the measurements
    error = sum((fitted[s] - y) ** 2 for s, y in zip(shapes, noisy))
    for _ in range(200):
        candidate = {s: fitted[s] + float(generator.normal(0, 0.05)) for s in shapes}
        if all(candidate[a] <= candidate[b] for a in shapes for b in shapes if a[0] <= b[0] and a[1] <= b[1]):
            assert sum((candidate[s] - y) ** 2 for s, y in zip(shapes, noisy)) >= error - 1e-9
    with pytest.raises(ValueError, match="shapes"):
        fit_step_costs([(9, 0)], [1.0, 2.0])


def test_step_ratios_cancel_a_slow_round(tmp_path, monkeypatch):
    """Every round times the baseline and each candidate; a round where the whole machine runs
    at a third of its speed leaves the ratios where they were, and the median drops a round
    that a slow spell split."""
    from raydec.bench import cost_tuner

    speed = {"value": 1.0}
    cost = {"ar": 1.0, "a": 2.0, "b": 3.0}
    calls = []

    def fake_run(target, config, prompts, seeds, batch):  # seconds per step: config cost / machine speed
        calls.append(config.method)
        return 10.0, cost[config.method] / speed["value"]

    monkeypatch.setattr(cost_tuner, "calibration_run", fake_run)
    configs = [SimpleNamespace(method="a"), SimpleNamespace(method="b")]
    baseline = SimpleNamespace(method="ar")
    speed["value"] = 1 / 3
    ratios = cost_tuner.timed_step_ratios(None, configs, baseline, ["p"], [0], 1, rounds=3)
    assert ratios == pytest.approx([2.0, 3.0]) and calls.count("ar") == 3 and len(calls) == 9
    # round one given (the counting runs): a spell that slowed only candidate "b" there is outvoted
    speed["value"] = 1.0
    ratios = cost_tuner.timed_step_ratios(None, configs, baseline, ["p"], [0], 1, rounds=3, first=[2.0, 9.0], first_baseline=1.0)
    assert ratios == pytest.approx([2.0, 3.0])


def test_bench_t2i_auto_window_reports_the_shapes_it_tried(tmp_path):
    from tests.tiny_models import build_tiny_janus

    model = build_tiny_janus(tmp_path / "janus")
    out = tmp_path / "t2i.json"
    code = bench_main(["t2i", "--model", str(model), "--methods", "ar,sjd_ac", "--prompts", "1", "--dtype", "float32",
                       "--tune-prompts", "1", "--plots", str(tmp_path / "plots"), "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    tried = [t for t in result["tuning"] if t["method"] == "sjd_ac"]
    best = max(tried, key=lambda t: t["predicted_speedup"])
    assert result["config"]["sjd_ac"]["jacobi"]["window"] == best["jacobi"]["window"]
    # the prior is chosen first, at the median window, and every shape is then tried with it
    (prior,) = result["fresh_drafts"]
    assert prior["method"] == "sjd_ac" and prior["probe"]["window"] == 32
    assert {t["jacobi"]["init"] for t in tried} == {prior["chosen"]} == {result["config"]["sjd_ac"]["jacobi"]["init"]}


def test_bench_t2i_fixed_window_and_prior_tune_nothing(tmp_path):
    from tests.tiny_models import build_tiny_janus

    model = build_tiny_janus(tmp_path / "janus")
    out = tmp_path / "t2i.json"
    code = bench_main(["t2i", "--model", str(model), "--methods", "ar,sjd", "--prompts", "1", "--dtype", "float32",
                       "--window", "4", "--init", "above", "--plots", str(tmp_path / "plots"), "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["fresh_drafts"] == [] and result["tuning"] == []
    assert result["config"]["sjd"]["jacobi"]["init"] == "above" and result["config"]["sjd"]["jacobi"]["window"] == 4


def test_tune_draft_chooses_the_fresh_draft_prior_first(tmp_path):
    """The prior needing the fewest forwards at the probe shape is the one every shape is tried with."""
    from raydec.api import load_target
    from raydec.config import JacobiDraftConfig
    from raydec.bench.cost_tuner import choose_fresh_drafts, probe_shape, tune_draft
    from tests.tiny_models import build_tiny_janus

    target = load_target(build_tiny_janus(tmp_path / "janus"), "t2i", dtype=torch.float32)
    args = dict(prompts=["a red circle", "a blue square"], seeds=[0, 1], sampling=target.default_sampling())
    assert probe_shape("sjd", (2, 8, 4)) == JacobiDraftConfig(window=4)
    assert probe_shape("sjd_pac", (4, 16), trees=((3, 2), (2, 1))) == JacobiDraftConfig(window=16, branching=3, tree_depth=2)
    chosen, steps = choose_fresh_drafts(target, "sjd_ac", JacobiDraftConfig(window=4), **args)
    assert set(steps) == {"uniform", "left", "above"} and all(v >= 1 for v in steps.values())
    assert steps[chosen] == min(steps.values())
    best, tried = tune_draft(target, "sjd_ac", windows=(2, 8), costs={1: 1.0, 3: 1.0, 9: 1.0}, **args)
    probe_choice, _ = choose_fresh_drafts(target, "sjd_ac", probe_shape("sjd_ac", (2, 8)), **args)
    assert {t.jacobi.init for t in tried} == {probe_choice}
    _, tried = tune_draft(target, "sjd_ac", windows=(2, 8), costs={1: 1.0, 3: 1.0, 9: 1.0}, inits=("above",), **args)
    assert {t.jacobi.init for t in tried} == {"above"}
    # SJD-PAC: trees take the prior chosen at its tree probe, chains the one SJD-AC's probe chooses
    _, tried = tune_draft(target, "sjd_pac", windows=(8,), trees=((1, 0), (2, 1)), costs={1: 1.0, 9: 1.0},
                          inits=("uniform", "above"), **args)
    ac_choice, _ = choose_fresh_drafts(target, "sjd_ac", probe_shape("sjd_ac", (8,)), inits=("uniform", "above"), **args)
    pac_choice, _ = choose_fresh_drafts(target, "sjd_pac", probe_shape("sjd_pac", (8,), ((1, 0), (2, 1))), inits=("uniform", "above"), **args)
    assert {(t.jacobi.branching, t.jacobi.init) for t in tried} == {(1, ac_choice), (2, pac_choice)}
    _, tried = tune_draft(target, "sjd_pac", windows=(8,), trees=((1, 0), (2, 1)), costs={1: 1.0, 9: 1.0},
                          inits=("above",), chain_init="uniform", **args)
    assert {(t.jacobi.branching, t.jacobi.init) for t in tried} == {(1, "uniform"), (2, "above")}
    with pytest.raises(ValueError, match="inits: expected at least one"):
        tune_draft(target, "sjd_ac", windows=(2, 8), costs={1: 1.0, 3: 1.0, 9: 1.0}, inits=(), **args)
    with pytest.raises(ValueError, match="init"):  # pydantic names the field and the value
        choose_fresh_drafts(target, "sjd_ac", JacobiDraftConfig(window=4), inits=("diagonal",), **args)


def test_fresh_drafts_are_chosen_by_the_rows_mean_forwards_at_batch_2(tmp_path):
    """A prior moves acceptance, which every row measures: at batch > 1 its figure is the rows'
    mean forwards, while a shape's steps per batch stay the slowest row's (consecutive batches)."""
    from raydec.api import load_target
    from raydec.config import DecodeConfig, JacobiDraftConfig
    from raydec.bench.cost_tuner import calibration_rows, calibration_run, choose_fresh_drafts
    from tests.tiny_models import build_tiny_janus

    target = load_target(build_tiny_janus(tmp_path / "janus"), "t2i", dtype=torch.float32)
    prompts, seeds = ["a red circle", "a blue square", "a green cross", "a big red circle"], [0, 1, 2, 3]
    sampling = target.default_sampling()
    _, steps = choose_fresh_drafts(target, "sjd", JacobiDraftConfig(window=4), prompts, seeds, sampling, batch=2, inits=("uniform",))
    config = DecodeConfig(
        method="sjd", max_new_tokens=int(target.num_image_tokens), sampling=sampling, jacobi=JacobiDraftConfig(window=4, init="uniform")
    )
    forwards = [r.target_forwards for r in calibration_rows(target, config, prompts, seeds, 2)]
    assert steps["uniform"] == pytest.approx(np.mean(forwards))
    per_batch, _ = calibration_run(target, config, prompts, seeds, 2)  # CPU: consecutive batches
    assert per_batch == pytest.approx(np.mean([max(forwards[0:2]), max(forwards[2:4])]))
    assert per_batch >= steps["uniform"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the messages of a machine without a GPU")
def test_device_option_resolves_auto_and_names_what_is_missing():
    from raydec.bench.common import resolve_device

    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    with pytest.raises(SystemExit, match="--device cuda: .* sees no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(SystemExit, match="--device: expected cpu, cuda, cuda:N or auto, got 'gpu0'"):
        resolve_device("gpu0")


def test_methods_option_names_unknown_methods_and_asks_for_the_ar_baseline():
    from raydec.bench.common import parse_methods, ratio_cell

    known = ("ar", "hf", "sjd")
    assert parse_methods(" ar, sjd ,", known) == ["ar", "sjd"]
    with pytest.raises(SystemExit, match=r"--methods: unknown sdj, eagle \(choose from ar, hf, sjd\)"):
        parse_methods("ar,sdj,eagle", known)
    with pytest.raises(SystemExit, match="--methods 'hf,sjd': add 'ar'"):
        parse_methods("hf,sjd", known)
    assert parse_methods("vispec,eagle", ("eagle", "vispec"), baseline=None) == ["vispec", "eagle"]  # draft studies
    with pytest.raises(SystemExit, match=r"--methods: none given \(choose from eagle, vispec\)"):
        parse_methods(" , ", ("eagle", "vispec"), baseline=None)
    with pytest.raises(SystemExit, match="--methods 'ar,sjd,ar': ar named more than once"):
        parse_methods("ar,sjd,ar", known)  # it would run twice into one record
    assert ratio_cell({"x": 2.345}, "x") == "2.35" and ratio_cell({}, "x") == "-"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["t2i", "--prompts", "0"], "argument --prompts: expected an integer >= 1, got 0"),
        (["t2i", "--window", "-4"], "argument --window: expected a positive integer or 'auto', got '-4'"),
        (["t2i", "--batch", "two"], "argument --batch: expected an integer >= 1, got 'two'"),
        (["caption", "--threads", "-1"], "argument --threads: expected an integer >= 0, got -1"),
        (["engine", "--new-tokens", "0"], "argument --new-tokens: expected an integer >= 1, got 0"),
        (["pipeline", "--cpus-per-worker", "0"], "argument --cpus-per-worker: expected a number > 0, got '0'"),
        (["t2i", "--max-seconds", "-5"], "argument --max-seconds: expected a number > 0, got '-5'"),
        (["caption", "--max-seconds", "nan"], "argument --max-seconds: expected a number > 0, got 'nan'"),
        (["t2i", "--plots", __file__], f"argument --plots: {__file__!r}: {__file__!r} is a file, not a folder"),
        (["pipeline", "--work-dir", __file__], f"argument --work-dir: {__file__!r}: {__file__!r} is a file, not a folder"),
    ],
)
def test_bench_options_reject_bad_counts_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_main(argv)
    assert message in capsys.readouterr().err


def test_bench_checks_option_values_before_loading_a_model(tmp_path, capsys):
    """Values only a config can judge, and an unwritable --json, fail before the long run."""
    with pytest.raises(SystemExit):
        bench_main(["t2i", "--json", str(tmp_path)])
    assert f"argument --json: {str(tmp_path)!r} is a folder" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        bench_main(["caption", "--json", str(tmp_path / "file" / "x.json")])
    assert "is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--window 8 --branching 3 --tree-depth 2: no valid sjd_pac draft .*widen --window"):
        bench_main(["t2i", "--methods", "ar,sjd_pac", "--window", "8", "--init", "left", "--model", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match=r"bad option value: SamplingConfig.temperature: .* \(got -1.0\)"):
        bench_main(["caption", "--temperature", "-1", "--model", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match=r"DraftTreeConfig: .*total_tokens=200: a tree of depth=6, top_k=2 has at most 22"):
        bench_main(["caption", "--depth", "6", "--top-k", "2", "--total-tokens", "200", "--model", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match=f"no text-to-image checkpoint at {tmp_path / 'none'}"):
        bench_main(["t2i", "--methods", "ar", "--model", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="--device: expected cpu, cuda, cuda:N or auto, got 'mps'"):
        bench_main(["t2i", "--device", "mps", "--model", str(tmp_path / "none")])


def test_tune_windows_option_parses_a_list_and_rejects_nonsense():
    import argparse

    from raydec.bench.t2i import _windows_arg

    assert _windows_arg("8,16, 64") == (8, 16, 64)
    for bad in ("", "0,8", "eight"):
        with pytest.raises(argparse.ArgumentTypeError, match="--tune-windows"):
            _windows_arg(bad)


def test_bench_t2i_max_seconds_stops_after_a_whole_chunk(tmp_path):
    from tests.tiny_models import build_tiny_janus

    out = tmp_path / "t2i.json"
    code = bench_main(["t2i", "--model", str(build_tiny_janus(tmp_path / "janus")), "--methods", "ar,sjd", "--prompts", "5",
                       "--batch", "2", "--chunk", "3", "--dtype", "float32", "--window", "8", "--max-seconds", "1e-6",
                       "--plots", str(tmp_path / "plots"), "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert (result["prompts"], result["prompts_requested"], result["chunk"]) == (3, 5, 3)


def test_calibration_counts_the_slowest_row_or_the_mean_as_batches_are_run(tmp_path):
    """Consecutive batches last as long as their slowest row; under continuous batching (an
    accelerator's by default) a finished row's place is refilled, so a batch's images take the mean."""
    from raydec.api import generate_images, load_target
    from raydec.config import DecodeConfig, JacobiDraftConfig
    from raydec.bench.cost_tuner import calibration_run
    from tests.tiny_models import build_tiny_janus

    target = load_target(build_tiny_janus(tmp_path / "janus"), "t2i", dtype=torch.float32)
    config = DecodeConfig(method="sjd", max_new_tokens=int(target.num_image_tokens), sampling=target.default_sampling(),
                          jacobi=JacobiDraftConfig(window=4))
    prompts, seeds = ["a red circle", "a blue square", "a green circle", "a red square"], [0, 1, 2, 3]
    forwards = [r.target_forwards for r in generate_images(prompts, model=target, decode=config, seeds=seeds, batch_size=2)]
    assert len(set(forwards)) > 1  # rows finish apart, so the two counts differ
    steps, per_step = calibration_run(target, config, prompts, seeds, batch=2)  # auto: consecutive on a CPU
    assert steps == pytest.approx(np.mean([max(forwards[0:2]), max(forwards[2:4])])) and per_step > 0

    continuous = config.model_copy(update={"batching": "continuous"})
    steps, per_step = calibration_run(target, continuous, prompts, seeds, batch=2)
    assert per_step > 0
    assert steps == pytest.approx(np.mean(forwards))  # a row's tokens, hence its forwards, never depend on the batch


def test_bench_refuses_runs_that_would_measure_nothing_or_the_calibration_prompts():
    from raydec.bench.t2i import TUNE_OFFSET

    with pytest.raises(SystemExit, match="give more rows than --batch-size 8"):
        bench_main(["pipeline", "--rows", "8"])
    with pytest.raises(SystemExit, match="would overlap the tuner's calibration prompts"):
        bench_main(["t2i", "--offset", str(TUNE_OFFSET - 2), "--prompts", "4"])
    with pytest.raises(SystemExit, match=r"--tune-windows: windows \[2\]: no sjd_pac draft tree fits"):
        bench_main(["t2i", "--methods", "ar,sjd_pac", "--tune-windows", "2", "--prompts", "1"])
    with pytest.raises(SystemExit, match=r"--seed 9223372036854775807: prompts take seeds .* past 2\*\*63 - 1"):
        bench_main(["t2i", "--methods", "ar", "--prompts", "2", "--seed", str(2**63 - 1), "--window", "16", "--init", "left"])


def test_bench_refuses_the_hf_baseline_on_a_checkpoint_it_cannot_run(tmp_path):
    """hf is Janus's own image generation: an Emu3 checkpoint is refused before it loads."""
    from tests.t2i_toys import tiny_emu3

    emu3 = tiny_emu3(tmp_path / "emu3")
    with pytest.raises(SystemExit, match=r"--methods hf: .* runs on Janus checkpoints; .* is a 'emu3' checkpoint"):
        bench_main(["t2i", "--model", str(emu3), "--methods", "ar,hf", "--prompts", "1", "--window", "16", "--init", "left"])
