"""The engine session: requests join a running batch, cancelled rows leave it, and a row's
tokens depend on its seed alone (not on the batch, the order or when it joined)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.jacobi import JacobiProposer
from tests.toys import tiny_llama

torch.set_num_threads(1)

PROMPTS = [[1, 5, 7, 9, 2], [3, 4], [8, 8, 8, 8, 8, 8, 2, 11], [10], [6, 1], [2, 2, 3]]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("session"), vocab=24, seed=5, dtype=torch.float64, layers=2, hidden=32)


def _engine(llama, method: str) -> Engine:
    spec = JacobiDraftConfig(window=8, branching=2, tree_depth=1)
    config = DecodeConfig(max_new_tokens=12, sampling=SamplingConfig(temperature=1.0), jacobi=spec)
    proposer = ARProposer() if method == "ar" else JacobiProposer(spec, method)
    return Engine(llama, proposer, config.sampling, config.max_new_tokens)


def _requests(count: int) -> list[RowRequest]:
    return [RowRequest(PROMPTS[i % len(PROMPTS)], seed=100 + i, max_new_tokens=6 + i % 5) for i in range(count)]


@pytest.mark.parametrize("method", ["ar", "sjd_pac"])
def test_requests_submitted_while_a_batch_decodes_join_it_and_match_generate(llama, method):
    requests = _requests(6)
    expected = [out.tokens for out in _engine(llama, method).generate(requests)]
    session = _engine(llama, method).session(batch_size=4)
    handles = [session.submit(r) for r in requests[:2]]
    session.step()  # admits the first two
    session.step()  # a decode step
    assert len(session.active) == 2 and session.steps == 1
    handles += [session.submit(r) for r in requests[2:]]  # arrive mid-run
    joined_at = None
    while session.busy:
        before = set(session.active)
        session.step()
        if joined_at is None and set(session.active) - before:
            joined_at = session.steps
            assert set(handles[:2]) & set(session.active)  # the first rows were still decoding: they were joined
    assert joined_at == 1
    assert [session.output(h).tokens for h in handles] == expected


def test_a_cancelled_row_frees_its_place_for_a_queued_one(llama):
    requests = _requests(3)
    expected = [out.tokens for out in _engine(llama, "sjd_pac").generate(requests)]
    session = _engine(llama, "sjd_pac").session(batch_size=2)
    finished: list[int] = []
    session.on_finish = lambda handle, output: finished.append(handle)
    handles = [session.submit(r) for r in requests]
    session.step()  # admits rows 0 and 1; row 2 waits
    assert session.active == handles[:2] and session.queue == handles[2:]
    session.step()
    session.cancel(handles[0])
    done = session.step()  # the cancelled row leaves; row 2 takes its place
    assert handles[0] in done and session.output(handles[0]).stats.finish_reason == "cancelled"
    assert handles[2] in session.active and handles[0] not in session.active
    while session.busy:
        session.step()
    assert [session.output(h).tokens for h in handles[1:]] == expected[1:]
    assert finished[0] == handles[0] and sorted(finished) == handles


def test_a_queued_request_cancelled_before_it_starts_never_decodes(llama):
    session = _engine(llama, "ar").session(batch_size=1)
    first, second = session.submit(_requests(1)[0]), session.submit(_requests(2)[1])
    session.cancel(second)
    while session.busy:
        session.step()
    assert session.output(second).tokens == [] and session.output(second).stats.finish_reason == "cancelled"
    assert session.output(first).stats.finish_reason == "length"


@pytest.mark.parametrize("method", ["ar", "sjd_pac"])
def test_a_loop_that_releases_what_step_reports_holds_no_row_at_the_end(llama, method):
    """Rows cancelled while queued (before any step, mid-run, and all that are left) are reported
    by ``step`` like a cancelled decoding row: once each, with reason "cancelled"."""
    session = _engine(llama, method).session(batch_size=2)
    handles = [session.submit(r) for r in _requests(8)]
    session.cancel(handles[3])  # queued, before anything ran
    reported: list[int] = []

    def step() -> None:
        for handle in session.step():
            assert session.output(handle).tokens or session.output(handle).stats.finish_reason == "cancelled"
            reported.append(handle)
            session.release(handle)

    step()  # admits rows 0 and 1
    session.cancel(handles[5])  # queued, mid-run
    session.cancel(handles[0])  # decoding
    step()
    assert handles[3] in reported and handles[5] in reported and handles[0] in reported
    while session.busy and len(session.active) + len(session.queue) > 3:
        step()
    for handle in list(session.queue):  # every row still waiting
        session.cancel(handle)
    while session.busy:
        step()
    assert sorted(reported) == handles and len(set(reported)) == len(reported)
    assert session.rows == {}


def test_a_row_cancelled_while_queued_and_released_at_once_is_not_reported_again(llama):
    session = _engine(llama, "ar").session(batch_size=1)
    first, second = session.submit(_requests(1)[0]), session.submit(_requests(2)[1])
    session.cancel(second)
    session.release(second)  # the caller read it at the cancel
    assert session.step() == []  # admits the first row
    finished = []
    while session.busy:
        finished += session.step()
    assert finished == [first] and list(session.rows) == [first]


@pytest.mark.parametrize("method", ["ar", "sjd", "sjd_pac"])
def test_a_rows_tokens_are_the_same_in_batch_1_and_16_in_any_order(llama, method):
    """float64: exactly the same tokens, whatever else shares the batch and in which order."""
    requests = _requests(16)
    alone = [_engine(llama, method).generate([r])[0].tokens for r in requests]
    together = [out.tokens for out in _engine(llama, method).generate(requests)]
    order = torch.randperm(16, generator=torch.Generator().manual_seed(1)).tolist()
    shuffled = _engine(llama, method).generate([requests[i] for i in order])
    assert together == alone
    assert [shuffled[order.index(i)].tokens for i in range(16)] == alone


def test_a_small_batch_is_refilled_every_step_while_rows_wait(llama):
    """Up to seven places, a quarter of the batch is one place: a freed place is taken at once."""
    session = _engine(llama, "sjd_pac").session(batch_size=4)
    handles = [session.submit(r) for r in _requests(10)]
    while session.busy:
        session.step()
    assert session.occupancy == 1.0
    assert all(session.output(h).stats.finish_reason == "length" for h in handles)


def test_a_prefill_budget_splits_an_admission_and_the_batch_decodes_between_admissions(llama):
    """Six queued rows, a budget of 10 prompt tokens: each admission takes the queued rows whose left-padded window
    (rows x the longest prompt) fits it, never two admission steps in a row while rows decode; the same tokens as
    without a budget."""
    requests = _requests(6)  # prompt lengths 5, 2, 8, 1, 2, 3
    expected = [out.tokens for out in _engine(llama, "sjd_pac").generate(requests)]
    session = _engine(llama, "sjd_pac").session(batch_size=6)
    session.prefill_budget = 10
    handles = [session.submit(r) for r in requests]
    joined, admitted_last = [], False
    while session.busy:
        before, steps = set(session.active), session.steps
        session.step()
        if session.steps == steps:  # an admission
            assert not (admitted_last and before), "two admissions in a row while rows decode"
            joined.append(sorted(handles.index(h) for h in set(session.active) - before))
        admitted_last = session.steps == steps
    assert joined == [[0, 1], [2], [3, 4, 5]]  # 2 x 5 (a third row: 3 x 8); 8 (8 and 1: 2 x 8); 3 x 3
    assert [session.output(h).tokens for h in handles] == expected
    assert not session._prompts  # the prefixes made to measure the budget went with their admission


@pytest.mark.parametrize("method", ["ar", "sjd_pac"])
def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks_between_decode_steps(llama, method):
    """A budget of 3 tokens: the 8-token prompt's prefill runs in three chunks, each after a decode step of the rows
    already decoding; every row's tokens are those it decodes without a budget."""
    requests = _requests(4)  # prompt lengths 5, 2, 8, 1
    requests[1] = dataclasses.replace(requests[1], max_new_tokens=12)  # decodes while the others are prefilled
    expected = [out.tokens for out in _engine(llama, method).generate(requests)]
    session = _engine(llama, method).session(batch_size=4)
    session.prefill_budget = 3
    first = session.submit(requests[1])
    while session.steps < 1:  # the 2-token prompt joins and decodes
        session.step()
    handles = [session.submit(r) for r in (requests[0], requests[2], requests[3])]
    kinds = []
    while session.busy:
        steps = session.steps
        session.step()
        kinds.append("decode" if session.steps > steps else "prefill")
    if method == "ar":  # one token a step: the first row decodes through the others' prefills
        # 5 tokens in chunks of 3 and 2; then 8 in chunks of 3, 3 and 2; each chunk after a decode step
        assert kinds[:10] == ["prefill", "decode"] * 5
    by_request = dict(zip([1, 0, 2, 3], [first] + handles))
    assert [session.output(by_request[i]).tokens for i in range(4)] == expected


def test_a_prefill_in_chunks_computes_the_one_forwards_logits_hidden_states_and_cache(llama):
    """The prefill window of three left-padded prompts run whole and in chunks of 2 positions x 3 rows: the last
    position's logits, every position's hidden states and every layer's keys and values agree (float64)."""
    from raydec.speculative.admission import prefill_chunk

    results = []
    for budget in (None, 6):
        session = _engine(llama, "ar").session(batch_size=4)
        handles = [session.submit(r) for r in _requests(3)]  # prompt lengths 5, 2, 8: a window of 8
        admission = session._begin_admission(handles)
        chunks = 1
        while not prefill_chunk(admission, llama, budget, want_hidden=True):
            chunks += 1
        results.append((chunks, admission.output(), admission.joining.kv))
    (whole_chunks, whole, whole_kv), (chunks, chunked, chunked_kv) = results
    assert (whole_chunks, chunks) == (1, 4)
    torch.testing.assert_close(chunked.logits, whole.logits, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked.hidden, whole.hidden, rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(chunked_kv.layers, whole_kv.layers):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(mine.values, theirs.values, rtol=1e-12, atol=1e-12)
