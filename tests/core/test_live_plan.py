"""LivePlans: a plan per batch bucket, the live batch's chosen with hysteresis (on plain row counts,
no model): the smallest bucket that holds the rows, a switch after ``patience`` steps of a changed
bucket and not before, no flapping when the count alternates."""

from __future__ import annotations

import pytest

from raydec.api.live_plan import LivePlans, bucket_sizes
from raydec.config import DecodeConfig, JacobiDraftConfig

PLANS = {1: DecodeConfig(method="sjd_pac", jacobi=JacobiDraftConfig(window=16, branching=3, tree_depth=1)),
         2: DecodeConfig(method="sjd", jacobi=JacobiDraftConfig(window=8)),
         4: DecodeConfig(method="sjd", jacobi=JacobiDraftConfig(window=3)),
         6: DecodeConfig(method="ar")}
WIDE, MID, NARROW, AR = "sjd_pac window=16,K=3,D=1,init=uniform", "sjd window=8,init=uniform", "sjd window=3,init=uniform", "ar"


def test_buckets_and_the_smallest_that_holds_the_rows():
    assert bucket_sizes(1) == [1] and bucket_sizes(6) == [1, 2, 4, 6] and bucket_sizes(8) == [1, 2, 4, 8]
    live = LivePlans(PLANS, patience=3)
    assert [live.wanted(rows) for rows in (1, 2, 3, 4, 5, 6, 9)] == [WIDE, MID, NARROW, NARROW, AR, AR, AR]


def test_a_switch_comes_after_patience_steps_not_before():
    live = LivePlans(PLANS, patience=3)
    assert live.update(1) == WIDE  # the first step takes the wanted plan
    assert [live.update(6) for _ in range(2)] == [WIDE, WIDE]
    assert live.update(6) == AR and live.switches == 1  # the third step that wants AR decodes with it
    assert [live.update(2), live.update(3), live.update(2)] == [AR, AR, MID]  # wanted other plans for 3 steps: the last wins
    assert live.record() == {"plan_in_use": MID, "steps_per_plan": {WIDE: 3, AR: 3, MID: 1}, "switches": 2, "patience": 3,
                             "buckets": {"1": WIDE, "2": MID, "4": NARROW, "6": AR}}
    assert live.config == PLANS[2]


def test_an_alternating_count_does_not_flap():
    live = LivePlans(PLANS, patience=2)
    labels = [live.update(rows) for rows in [6] + [1, 6] * 20]
    assert set(labels) == {AR} and live.switches == 0
    assert LivePlans(PLANS, patience=1).update(1) == WIDE


def test_plans_that_cannot_follow_are_refused():
    with pytest.raises(ValueError, match="only ar, sjd, sjd_ac, sjd_pac"):
        LivePlans({1: DecodeConfig(method="eagle"), 2: DecodeConfig(method="ar")})
    with pytest.raises(ValueError, match="'auto'"):
        LivePlans({1: DecodeConfig(method="sjd", jacobi="auto")})
    with pytest.raises(ValueError, match="without make"):
        LivePlans(PLANS).proposer_for(1)
