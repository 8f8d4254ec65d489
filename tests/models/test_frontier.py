"""The shape for a batch (raydec.frontier): plain AR is a candidate, and it wins where a draft
window's forward costs far more than a one-token forward."""

from __future__ import annotations

import time

import pytest
import torch

from raydec.api import generate_images, load_target
from raydec.config import DecodeConfig, JacobiDraftConfig
from raydec.frontier import candidate_configs, shape_label, tune_for_batch
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
    base = DecodeConfig(method="sjd_pac", draft=JacobiDraftConfig(init="left"), max_new_tokens=64)
    candidates = candidate_configs(base, windows=(8, 16))
    assert [shape_label(c) for c in candidates] == ["ar", "window=8", "window=8,K=3,D=1", "window=16", "window=16,K=3,D=1"]
    assert all(c.draft.init == "left" and c.max_new_tokens == 64 for c in candidates)
    trees = candidate_configs(DecodeConfig(method="vispec"))
    assert shape_label(trees[0]) == "ar" and all(c.method == "vispec" for c in trees[1:])
    with pytest.raises(ValueError, match="AR must come first"):
        tune_for_batch(lambda c: 1.0, candidates[1:], rows=1)


def test_ar_is_chosen_where_a_window_costs_far_more_than_one_token(janus):
    costly = CostlyWindows(janus, seconds_per_token=0.01)
    base = DecodeConfig(method="sjd_pac", draft=JacobiDraftConfig(init="left"))
    prompts = ["a red circle", "two blue squares"]

    def seconds(config: DecodeConfig) -> float:
        start = time.perf_counter()
        generate_images(prompts, model=costly, decode=config, seeds=[1, 2], batch_size=2)
        return time.perf_counter() - start

    chosen, trials = tune_for_batch(seconds, candidate_configs(base, windows=(8,)), rows=2, rounds=1)
    assert chosen.method == "ar", [(shape_label(t.config), t.ratio_to_ar) for t in trials]
    assert all(t.ratio_to_ar < 1.0 for t in trials[1:])  # every window paid more than it saved
    assert trials[0].ratio_to_ar == 1.0
