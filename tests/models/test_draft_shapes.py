"""The shape for a batch (raydec.api.draft_shapes): plain AR is a candidate, and it wins where a draft
window's forward costs far more than a one-token forward."""

from __future__ import annotations

import json
import time

import pytest
import torch

from raydec.api import generate_images, load_target
from raydec.config import DecodeConfig, JacobiDraftConfig
from raydec.api.draft_shapes import ShapeCache, candidate_configs
from raydec.api.inputs import image_decode_config
from raydec.api.plan import CallCalibration, plan_decode
from raydec.api.tuner import (
    CAPTURED_ROUNDS, EXTRA_ROUNDS, FINALISTS, KEEP_MORE, ROUNDS, calibration_pool_size, round_parts, round_rows, shape_label, tune_for_batch,
)
from tests.t2i_toys import tiny_janus


class CostlyWindows:
    """A real target whose forwards over several new tokens each take ``seconds_per_token`` more
    per token (a device where a window costs far more than one token)."""

    def __init__(self, target, seconds_per_token: float) -> None:
        self._target, self._seconds = target, seconds_per_token

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward(self, inputs_embeds, input_ids, *args, **kwargs):
        if input_ids is not None and input_ids.shape[1] > 1:  # a draft window, not a one-token step or a prefill
            time.sleep(self._seconds * input_ids.shape[1])
        return self._target.forward(inputs_embeds, input_ids, *args, **kwargs)


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    return load_target(str(tiny_janus(tmp_path_factory.mktemp("draft_shapes") / "janus")), task="t2i", dtype=torch.float32)


def test_candidates_start_with_ar_and_keep_the_methods_prior_and_sampling():
    base = DecodeConfig(method="sjd_pac", jacobi=JacobiDraftConfig(init="left"), max_new_tokens=64)
    candidates = candidate_configs(base, windows=(8, 16))
    assert [shape_label(c) for c in candidates] == ["ar", "window=8,init=left", "window=8,K=3,D=1,init=left",
                                                       "window=16,init=left", "window=16,K=3,D=1,init=left"]
    assert all(c.max_new_tokens == 64 for c in candidates) and all(c.jacobi.init == "left" for c in candidates[1:])
    auto = candidate_configs(base.model_copy(update={"jacobi": "auto"}), windows=(16,))
    assert [shape_label(c) for c in auto] == ["ar", "window=16,init=uniform", "window=16,K=3,D=1,init=uniform",
                                              "window=16,init=left", "window=16,K=3,D=1,init=left"]
    trees = candidate_configs(DecodeConfig(method="vispec"))
    assert shape_label(trees[0]) == "ar" and all(c.method == "vispec" for c in trees[1:])
    with pytest.raises(ValueError, match="AR must come first"):
        tune_for_batch(lambda c, turn: 1.0, candidates[1:], rows=1)


def test_each_tuning_round_decodes_its_own_rows():
    assert round_rows(list("abcdefg"), 3, 0) == list("abc") and round_rows(list("abcdefg"), 3, 1) == list("def")
    assert round_rows(list("abcdefg"), 3, 2) == list("gab")  # cycles when the pool is short
    assert round_rows(list("ab"), 8, 1) == list("ab")  # never more rows than the pool
    candidates = candidate_configs(DecodeConfig(method="sjd_pac", jacobi=JacobiDraftConfig(init="left")), windows=(8, 16))
    lucky, steady = shape_label(candidates[1]), shape_label(candidates[3])
    # seconds per (shape, round): `lucky` is fastest on round 0's rows only, `steady` on every round
    table = {lucky: [0.2, 0.9, 0.9], steady: [0.5, 0.5, 0.5]}
    turns = []

    def seconds(config: DecodeConfig, turn: int) -> float:
        turns.append(turn)
        return table.get(shape_label(config), [1.0] * 3)[turn]

    chosen, _ = tune_for_batch(seconds, candidates, rows=4, rounds=3)
    assert shape_label(chosen) == steady and sorted(set(turns)) == [0, 1, 2]


def test_a_round_in_parts_takes_turns_so_a_slow_spell_falls_on_every_candidate():
    assert [round_parts(b, 8) for b in (1, 3, 8, 32)] == [(8, 1), (2, 4), (1, 8), (1, 8)] and round_parts(8, 16) == (2, 8)
    candidates = shapes()
    fast, slow = shape_label(candidates[1]), shape_label(candidates[2])
    # `fast` decodes a part in 0.5 s, `slow` in 0.55 s, AR in 1 s; the machine runs at half speed
    # for the 6th to the 15th call: a round decoded whole puts such a spell on whichever candidates
    # come then, parts taking turns spread it across all of them
    truth = {"ar": 1.0, fast: 0.5, slow: 0.55}
    calls: list[tuple[str, int]] = []

    def seconds(config: DecodeConfig, turn: int) -> float:
        calls.append((shape_label(config), turn))
        return truth.get(shape_label(config), 2.0) * (2.0 if 6 <= len(calls) <= 15 else 1.0)

    chosen, trials = tune_for_batch(seconds, candidates, rows=4, rounds=1, extra_rounds=0, parts=4)
    assert shape_label(chosen) == fast
    assert [turn for _, turn in calls] == [p for p in range(4) for _ in range(5)]  # every candidate on part 0, then 1, ...
    assert [label for label, turn in calls if turn == 1][0] == shape_label(candidates[1])  # the order rotated part by part
    assert trials[1].ratio_to_ar > trials[2].ratio_to_ar > 1.0
    whole: list[tuple[str, int]] = []

    def whole_seconds(config: DecodeConfig, turn: int) -> float:  # one call per round: the spell lands on `fast` alone
        whole.append((shape_label(config), turn))
        return 4 * truth.get(shape_label(config), 2.0) * (2.0 if shape_label(config) == fast else 1.0)

    chosen, _ = tune_for_batch(whole_seconds, candidates, rows=4, rounds=1, extra_rounds=0)
    assert shape_label(chosen) == slow and [turn for _, turn in whole] == [0] * 5
    with pytest.raises(ValueError, match="parts must be >= 1"):
        tune_for_batch(seconds, candidates, rows=4, parts=0)


class Scripted:
    """decode_seconds on hand-made timings: AR takes 1 s every round, a shape 1 / ratio seconds, its
    ratio to AR per round from ``ratios`` (label -> one ratio per turn), 1 where none is given; every
    call is recorded as (label, turn)."""

    def __init__(self, ratios: dict[str, list[float]]) -> None:
        self.ratios, self.calls = ratios, []

    def __call__(self, config: DecodeConfig, turn: int) -> float:
        label = shape_label(config)
        self.calls.append((label, turn))
        return 1.0 if label == "ar" else 1.0 / self.ratios.get(label, [1.0] * 8)[turn]

    def timed(self, turn: int) -> list[str]:
        return sorted(label for label, t in self.calls if t == turn)


def shapes(windows=(8, 16)) -> list[DecodeConfig]:
    return candidate_configs(DecodeConfig(method="sjd_pac", jacobi=JacobiDraftConfig(init="left")), windows=windows)


def test_a_close_call_gets_extra_rounds_on_fresh_rows():
    candidates = shapes()
    leader, better = shape_label(candidates[1]), shape_label(candidates[2])
    # `better` is 3% faster than `leader` on most rows, but unlucky on round 0's and a little slow
    # on round 2's, so after the three rounds `leader` leads (2.0 against 1.96)
    ratios = {leader: [2.0] * 5, better: [1.9, 2.06, 1.96, 2.06, 2.06]}
    without, _ = tune_for_batch(Scripted(ratios), candidates, rows=4, rounds=3, extra_rounds=0)
    assert shape_label(without) == leader
    script = Scripted(ratios)
    chosen, trials = tune_for_batch(script, candidates, rows=4, rounds=3)
    assert shape_label(chosen) == better
    # each extra round times AR and the two within 5% only, on rows of its own (turns 3 and 4)
    assert script.timed(3) == script.timed(4) == sorted(["ar", leader, better])
    assert [len([c for c in script.calls if c[0] == label]) for label in ("ar", leader, better)] == [5, 5, 5]
    assert trials[2].ratio_to_ar == pytest.approx(2.06) and trials[1].ratio_to_ar == pytest.approx(2.0)


def test_the_first_cut_keeps_a_shape_nearly_level_with_the_leaders():
    candidates = shapes()  # AR and four shapes: the top half is two
    first, second, near, far = (shape_label(c) for c in candidates[1:])
    # round 0: `near` is third but within 10% of the best (1.85 >= 0.9 * 2.0), `far` is 20% behind;
    # on the later rows both are the fastest of all
    ratios = {first: [2.0] * 5, second: [1.95] * 5, near: [1.85, 2.4, 2.4], far: [1.6, 2.6, 2.6, 2.6, 2.6]}
    script = Scripted(ratios)
    chosen, trials = tune_for_batch(script, candidates, rows=4, rounds=3)
    assert script.timed(1) == script.timed(2) == sorted(["ar", first, second, near])
    assert shape_label(chosen) == near  # 2.4 is clear ahead of 2.0: no extra round
    assert all(turn < ROUNDS for _, turn in script.calls)
    assert trials[4].ratio_to_ar == pytest.approx(1.6)  # `far` keeps its trial, its one round


def test_a_captured_step_is_screened_eagerly_and_its_finalists_compiled_and_timed_captured():
    """compile on: every candidate is screened with its step eager; AR and the FINALISTS best shapes
    decode one untimed part each (their compile), then CAPTURED_ROUNDS rounds captured, and the
    choice is made among them on the captured timings alone."""
    candidates = [c.model_copy(update={"compile": "on"}) for c in shapes()]
    first, second, third, fourth = (shape_label(c) for c in candidates[1:])
    # eagerly `first` leads; captured, `second` gains more (its eager step had more to save)
    # and AR gains so much that it beats `first`
    eager = {"ar": 1.0, first: 0.4, second: 0.45, third: 0.6, fourth: 0.8}
    captured = {"ar": 0.4, first: 0.42, second: 0.3}
    calls: list[tuple[str, str, int]] = []

    def seconds(config: DecodeConfig, turn: int) -> float:
        label = shape_label(config)
        calls.append((label, config.compile, turn))
        return (captured if config.compile == "on" else eager)[label]

    chosen, trials = tune_for_batch(seconds, candidates, rows=4, rounds=3, captured=True)
    assert shape_label(chosen) == second and chosen.compile == "on"  # the candidate itself, captured
    compiled = [(label, turn) for label, mode, turn in calls if mode == "on"]
    assert sorted({label for label, _ in compiled}) == sorted(["ar", first, second]) and FINALISTS == 2
    assert len(compiled) == 3 * (1 + CAPTURED_ROUNDS)  # one untimed part each, then the captured rounds
    assert all(mode == "off" for _, mode, _ in calls[: len(calls) - len(compiled)])  # the screening came first, eager
    by_label = {shape_label(t.config): t for t in trials}
    assert by_label[second].captured and by_label[second].ratio_to_ar == pytest.approx(0.4 / 0.3)
    assert not by_label[third].captured and by_label[third].ratio_to_ar == pytest.approx(1 / 0.6)
    # a step that is not captured is timed as it is, with no compile: the eager leader
    calls.clear()
    chosen, _ = tune_for_batch(seconds, [c.model_copy(update={"compile": "off"}) for c in candidates], rows=4, rounds=3)
    assert shape_label(chosen) == first and {mode for _, mode, _ in calls} == {"off"}


def test_extra_rounds_run_only_for_a_close_call_and_at_most_extra_rounds():
    candidates = shapes()
    first, second = shape_label(candidates[1]), shape_label(candidates[2])
    # a clear lead (second 10% behind): round 0 times all five, rounds 1 and 2 AR and the top two
    clear = Scripted({first: [2.0] * 5, second: [1.8] * 5})
    chosen, _ = tune_for_batch(clear, candidates, rows=4, rounds=3)
    assert shape_label(chosen) == first and len(clear.calls) == 5 + 2 * 3
    # a dead heat goes on for EXTRA_ROUNDS rounds, no more; the tie keeps the earlier candidate
    tied = Scripted({first: [2.0] * 5, second: [2.0] * 5})
    chosen, _ = tune_for_batch(tied, candidates, rows=4, rounds=3)
    assert shape_label(chosen) == first and len(tied.calls) == 5 + 2 * 3 + EXTRA_ROUNDS * 3
    assert max(turn for _, turn in tied.calls) == ROUNDS + EXTRA_ROUNDS - 1
    # six shapes level with AR: the top half and two more go on (KEEP_MORE), an extra round times AR
    # and three of them, and AR wins the tie
    six = shapes(windows=(8, 16, 32))
    level = Scripted({})
    chosen, _ = tune_for_batch(level, six, rows=4, rounds=3)
    assert chosen.method == "ar" and len(level.calls) == 7 + 2 * (1 + 3 + KEEP_MORE) + EXTRA_ROUNDS * 4
    assert level.timed(3) == sorted(["ar", *(shape_label(c) for c in six[1:4])])
    # every round decodes rows of its own: the pool holds a fresh set for the extra rounds too
    assert calibration_pool_size(8) == 8 * (ROUNDS + EXTRA_ROUNDS)


def test_a_shape_left_out_of_the_extra_rounds_does_not_win_on_fewer_rounds():
    candidates = shapes()
    a, b, x = (shape_label(c) for c in candidates[1:4])
    # after the three rounds: a 2.0, b 1.95 (a close call), x 1.85 (outside 5%: no extra round for it);
    # on the extra rounds' rows a and b fall to 1.5 and 1.7, below x's median of its three rounds
    ratios = {a: [1.7, 2.0, 2.0, 1.5, 1.5], b: [1.8, 1.95, 1.95, 1.7, 1.7], x: [1.85] * 5}
    script = Scripted(ratios)
    chosen, trials = tune_for_batch(script, candidates, rows=4, rounds=3)
    assert script.timed(3) == script.timed(4) == sorted(["ar", a, b])
    assert trials[3].ratio_to_ar > trials[2].ratio_to_ar > trials[1].ratio_to_ar  # x 1.85, b 1.8, a 1.7
    assert shape_label(chosen) == b  # the best of those timed in every round


def test_ar_is_chosen_where_a_window_costs_far_more_than_one_token(janus):
    costly = CostlyWindows(janus, seconds_per_token=0.01)
    base = DecodeConfig(method="sjd_pac", jacobi=JacobiDraftConfig(init="left"))
    prompts = ["a red circle", "two blue squares"]

    def seconds(config: DecodeConfig, turn: int) -> float:
        start = time.perf_counter()
        generate_images(prompts, model=costly, decode=config, seeds=[1, 2], batch_size=2)
        return time.perf_counter() - start

    chosen, trials = tune_for_batch(seconds, candidate_configs(base, windows=(8,)), rows=2, rounds=1)
    assert chosen.method == "ar", [(shape_label(t.config), t.ratio_to_ar) for t in trials]
    assert all(t.ratio_to_ar < 1.0 for t in trials[1:])  # every window paid more than it saved
    assert trials[0].ratio_to_ar == 1.0


def test_auto_decodes_with_ar_where_speculation_does_not_pay(janus, tmp_path, monkeypatch):
    monkeypatch.setenv("RAYDEC_CACHE_DIR", str(tmp_path))
    costly = CostlyWindows(janus, seconds_per_token=0.004)
    results = generate_images(["a red circle", "two blue squares"], model=costly,
                              decode={"method": "sjd_pac", "jacobi": "auto"}, seeds=[1, 2], batch_size=2)
    assert all(r.tokens_per_forward == 1.0 for r in results)  # one token per forward: plain AR
    [entry] = (tmp_path / "shapes").glob("*.json")
    assert '"method": "ar"' in entry.read_text()


def test_a_tuned_shape_is_cached_and_reused_and_decodes_as_the_shape_it_records(janus, tmp_path, monkeypatch):
    monkeypatch.setenv("RAYDEC_CACHE_DIR", str(tmp_path))
    prompts, seeds = ["a red circle", "two blue squares", "a green triangle"], [3, 4, 5]
    auto = {"method": "sjd_pac", "jacobi": "auto"}
    first = generate_images(prompts, model=janus, decode=auto, seeds=seeds, batch_size=2)
    cache = ShapeCache(tmp_path / "shapes")
    [entry] = cache.folder.glob("*.json")
    calls = []
    calibration = CallCalibration(janus, 3, lambda config, batch, rows: calls.append(config), "off")
    again = plan_decode(image_decode_config(DecodeConfig(**auto), janus), 2, calibration, cache=cache)  # as generate_images resolves it
    assert calls == [] and again.shape_from == "cache"  # from the cache, nothing decoded
    assert again.key == json.loads(entry.read_text())["key"] and again.record()["label"] == first[0].plan
    second = generate_images(prompts, model=janus, decode=auto, seeds=seeds, batch_size=2)
    fixed = generate_images(prompts, model=janus, decode=again.decode, seeds=seeds, batch_size=2)
    assert [r.tokens for r in first] == [r.tokens for r in second] == [r.tokens for r in fixed]
    assert len(list(cache.folder.glob("*.json"))) == 1
    # a job (or a Serve replica) with the same model, decode config and batch takes the same entry
    from raydec.runtime.config import ProcessorConfig
    from raydec.runtime.planning import shape_cache_key

    job = ProcessorConfig(task="t2i", model=janus.model.name_or_path, dtype="float32", decode=auto, batch_size=2)
    assert cache.get(shape_cache_key(job, janus)) == json.loads(entry.read_text())["shape"]
