"""A session that follows a policy swaps its proposer between steps (AR and the Jacobi methods take a
running batch over); under the Gumbel coupling every row still commits the tokens plain AR commits
with its seed, whatever proposers it met, as rows join and leave the batch. A policy that lists a
proposer that cannot take a batch over is refused."""

from __future__ import annotations

import pytest
import torch

from raydec.config import DraftTreeConfig, JacobiDraftConfig, SamplingConfig
from raydec.speculative.engine import Engine
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.draft_tree import DraftTreeProposer
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.requests import RowRequest

torch.set_num_threads(1)

SAMPLING = SamplingConfig(temperature=1.0)
LENGTH = 14
ORDER = ["sjd_pac k2 d2", "sjd w3", "ar"]


class ByRows:
    """1 row: sjd_pac, 2 rows: sjd window 3, 3 rows: AR; every third step moves one further along
    ``ORDER``, so rows meet all three mid-decode."""

    def __init__(self, extra: dict | None = None) -> None:
        self.table = {"ar": ARProposer(), "sjd w3": JacobiProposer(JacobiDraftConfig(window=3), "sjd"),
                      "sjd_pac k2 d2": JacobiProposer(JacobiDraftConfig(window=7, branching=2, tree_depth=2), "sjd_pac"),
                      **(extra or {})}
        self.calls = 0
        self.seen: list[int] = []

    def proposers(self) -> dict:
        return self.table

    def proposer_for(self, live_rows: int):
        self.calls += 1
        self.seen.append(live_rows)
        return self.table[ORDER[(min(live_rows, 3) - 1 + self.calls // 3) % 3]]


def _requests(count: int) -> list[RowRequest]:
    return [RowRequest([1 + i % 7, 5, 2 + i % 3], seed=2000 + i, max_new_tokens=LENGTH - (i % 4) * 3) for i in range(count)]


def _decode(engine: Engine, requests: list[RowRequest], batch: int, policy=None):
    session = engine.session(batch_size=batch)
    if policy is not None:
        session.follow(policy)
    handles = [session.submit(request) for request in requests]
    while session.busy:
        for handle in session.step():
            pass
    return [session.output(handle).tokens for handle in handles], session


def test_a_following_session_swaps_proposers_and_keeps_each_rows_ar_tokens(llama):
    requests = _requests(7)
    alone = Engine(llama, ARProposer(), SAMPLING, LENGTH, coupling="gumbel", compile="off")
    reference = [_decode(alone, [request], 1)[0][0] for request in requests]
    policy = ByRows()
    engine = Engine(llama, JacobiProposer(JacobiDraftConfig(window=4), "sjd"), SAMPLING, LENGTH, coupling="gumbel", compile="off")
    got, session = _decode(engine, requests, 3, policy)
    assert got == reference
    assert set(policy.seen) == {1, 2, 3}  # rows joined and left: the batch ran at every size
    steps = session.steps_by_proposer
    assert set(steps) == set(ORDER) and sum(steps.values()) == session.steps == policy.calls
    assert session.follower.swaps >= 3 and engine.proposer in policy.table.values()
    assert all(proposer.captured is engine.captured for proposer in policy.table.values())


def test_a_policy_with_a_proposer_that_cannot_take_a_batch_over_is_refused(llama):
    engine = Engine(llama, ARProposer(), SAMPLING, LENGTH, coupling="gumbel", compile="off")
    session = engine.session(batch_size=2)
    policy = ByRows({"eagle": DraftTreeProposer(None, DraftTreeConfig(depth=2, top_k=2, total_tokens=4))})
    with pytest.raises(ValueError, match="'eagle' \\(DraftTreeProposer\\) cannot take over a running batch"):
        session.follow(policy)
    assert session.follower is None and session.steps_by_proposer == {}
