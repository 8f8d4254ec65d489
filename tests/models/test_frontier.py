"""The shape for a batch (raydec.frontier): plain AR is a candidate, and it wins where a draft
window's forward costs far more than a one-token forward."""

from __future__ import annotations

import json
import time

import pytest
import torch

from raydec.api import generate_images, load_target
from raydec.config import DecodeConfig, JacobiDraftConfig
from raydec.api.frontier import (
    ShapeCache, apply_shape, candidate_configs, resolve_shape, round_rows, shape_label, tune_for_batch,
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
    return load_target(str(tiny_janus(tmp_path_factory.mktemp("frontier") / "janus")), task="t2i", dtype=torch.float32)


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
    again = resolve_shape(DecodeConfig(**auto), 2, lambda c, turn: calls.append(c) or 1.0, 2,
                          key=json.loads(entry.read_text())["key"], cache=cache)
    assert calls == [] and again[1]["tuned"] is False  # from the cache, nothing decoded
    second = generate_images(prompts, model=janus, decode=auto, seeds=seeds, batch_size=2)
    fixed = generate_images(prompts, model=janus, decode=apply_shape(DecodeConfig(**auto), again[1]), seeds=seeds, batch_size=2)
    assert [r.tokens for r in first] == [r.tokens for r in second] == [r.tokens for r in fixed]
    assert len(list(cache.folder.glob("*.json"))) == 1
