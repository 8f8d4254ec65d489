"""When queued rows join a running batch (raydec.speculative.refill), on hand-made timings."""

from __future__ import annotations

from raydec.speculative.refill import RefillPolicy


def test_an_empty_batch_and_a_first_refill_admit_at_once():
    policy = RefillPolicy()
    assert policy.should_admit(active=0, queued=40, batch_size=16)
    policy.admitted(seconds=0.16, rows=16, while_decoding=False)  # 0.01 s of prefill per row
    assert policy.prefill_seconds == 0.01
    assert policy.should_admit(active=15, queued=40, batch_size=16)  # no refill measured yet


def test_a_refill_waits_until_the_empty_places_have_cost_its_overhead():
    policy = RefillPolicy()
    policy.admitted(seconds=0.16, rows=16, while_decoding=False)
    policy.admitted(seconds=0.05, rows=1, while_decoding=True)  # 0.04 s beyond the row's prefill
    assert abs(policy.overhead_seconds - 0.04) < 1e-12 and policy.wasted_seconds == 0.0
    waited = 0
    while not policy.should_admit(active=15, queued=40, batch_size=16):
        policy.stepped(seconds=0.08, active=15, queued=40, batch_size=16)  # one place empty: 0.005 s lost a step
        waited += 1
    assert waited == 8
    policy.stepped(seconds=0.08, active=14, queued=40, batch_size=16)  # two empty places lose twice as fast
    assert abs(policy.wasted_seconds - (8 * 0.005 + 0.01)) < 1e-12


def test_a_quarter_free_or_the_whole_queue_fitting_admits_at_once():
    policy = RefillPolicy(prefill_seconds=0.01, overhead_seconds=100.0)  # refills look ruinous
    assert policy.should_admit(active=12, queued=40, batch_size=16)  # a quarter free
    assert not policy.should_admit(active=13, queued=40, batch_size=16)
    assert policy.should_admit(active=14, queued=2, batch_size=16)  # the queue's last rows fit
    assert policy.should_admit(active=6, queued=40, batch_size=7)  # a quarter of seven is one place
    assert not policy.should_admit(active=16, queued=40, batch_size=16)  # no place
    assert not policy.should_admit(active=3, queued=0, batch_size=16)  # nothing queued


def test_occupancy_counts_only_the_steps_with_rows_waiting():
    policy = RefillPolicy()
    assert policy.occupancy is None
    policy.stepped(seconds=1.0, active=16, queued=4, batch_size=16)
    policy.stepped(seconds=1.0, active=12, queued=4, batch_size=16)
    policy.stepped(seconds=1.0, active=2, queued=0, batch_size=16)  # the queue is empty: a draining tail
    assert policy.occupancy == (1.0 + 0.75) / 2
