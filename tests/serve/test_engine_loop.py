"""The pieces under a replica, in this process: schedulers that take requests over time
(equal to the public functions, rows released so memory stays flat), the engine loop, and the
engine process a replica restarts when it dies."""

from __future__ import annotations

import asyncio
import queue

import numpy as np
import pytest


def test_image_scheduler_equals_generate_images_and_releases_rows():
    from raydec.api import generate_images
    from raydec.api.schedulers import ImageScheduler

    scheduler = ImageScheduler("reference", {"method": "sjd"}, batch_size=4)
    first = scheduler.submit("a red circle on the left", seed=3)
    for _ in range(5):  # first decodes a few steps alone
        scheduler.step()
    second = scheduler.submit("a blue square at the top", seed=4, method="ar", sampling={"temperature": 0.7})
    results = {}
    while scheduler.busy:
        for ticket in scheduler.step():
            results[ticket] = scheduler.result(ticket)
            scheduler.release(ticket)
    expected = generate_images(["a red circle on the left"], decode={"method": "sjd"}, seeds=[3])[0]
    assert np.array_equal(np.asarray(results[first].image), np.asarray(expected.image))
    expected = generate_images(["a blue square at the top"], decode={"method": "ar", "sampling": {"temperature": 0.7}}, seeds=[4])[0]
    assert results[second].tokens == expected.tokens
    assert all(not s.rows for s in scheduler.sessions.values())  # released: nothing kept per request
    with pytest.raises(ValueError, match="text-to-image method"):
        scheduler.submit("x", seed=1, method="vispec")
    with pytest.raises(ValueError, match="per request"):
        scheduler.submit("x", seed=1, sampling={"cfg_scale": 3.0})


def test_cancelled_queued_row_and_release_of_a_running_row():
    from raydec.api.schedulers import ImageScheduler

    scheduler = ImageScheduler("reference", {"method": "ar"}, batch_size=1)
    running = scheduler.submit("a red circle", seed=1)
    queued = scheduler.submit("a blue circle", seed=2)
    scheduler.step()
    with pytest.raises(ValueError, match="still queued or decoding"):
        scheduler.release(running)
    scheduler.cancel(queued)
    assert scheduler.row(queued).done and scheduler.row(queued).stats.finish_reason == "cancelled"
    scheduler.release(queued)
    scheduler.cancel(running)
    assert scheduler.step() == [running]
    scheduler.release(running)
    assert not scheduler.busy


def test_caption_session_stop_string():
    from raydec.api import caption_images
    from raydec.api.schedulers import CaptionScheduler
    from raydec.reference.shapes import sample_images

    image = sample_images([7])[0]
    expected = caption_images([image], decode={"method": "vispec"}, seeds=[1])[0].caption
    stop = " " + expected.split()[4] + " "
    scheduler = CaptionScheduler("reference", {"method": "vispec"}, batch_size=2)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe the image ."}]}]
    ticket = scheduler.submit(messages, [image], seed=1, stop=[stop])
    plain = scheduler.submit(messages, [image], seed=1)
    done = {}
    while scheduler.busy:
        for t in scheduler.step():
            done[t] = scheduler.result(t)
    assert done[plain].caption == expected
    assert done[ticket].caption == expected[: expected.find(stop)] and done[ticket].finish_reason == "stop"


def test_an_engine_that_dies_is_restarted_and_one_that_cannot_start_fails_the_health_check(serve_app, tmp_path):
    """The replica class in this process (ray is up: its metrics need it), its model a copy of the reference
    Janus: its engine process killed, a new one starts; with the model's folder gone, none can, and the
    health check fails (Serve then replaces the replica). Stopping the replica leaves no engine process."""
    import os
    import shutil
    import signal
    import time

    from raydec.reference.load import WEIGHTS_DIR
    from raydec.serve.config import LimitsConfig, ServedModel
    from raydec.serve.replica import ImageReplica

    folder = shutil.copytree(WEIGHTS_DIR / "t2i", tmp_path / "t2i")
    replica = ImageReplica(ServedModel(name="t", task="t2i", model=str(folder), decode={"method": "ar"}), LimitsConfig())
    first = replica.engine.pid
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while replica.engine.restarts == 0:  # the health check holds while the new engine starts
        replica.check_health()
        assert time.monotonic() < deadline, "no new engine started"
        time.sleep(0.1)
    second = replica.engine.pid
    assert second not in (None, first)
    assert asyncio.run(replica.stats())["engine_pid"] == second
    shutil.rmtree(folder)
    os.kill(second, signal.SIGKILL)
    while replica.engine.failed is None:
        assert time.monotonic() < deadline, "the engine that cannot start never failed"
        time.sleep(0.1)
    with pytest.raises(RuntimeError, match="engine of model 't' died: .*did not start"):
        replica.check_health()
    replica.engine.stop()
    assert replica.engine.pid is None and replica.engine._process.poll() is not None

def test_a_request_past_its_deadline_gets_408_and_is_closed():
    from raydec.serve.boundary import ImageDone, PartialImage, RowStats
    from raydec.serve.errors import APIError
    from raydec.serve.ingress import with_deadline

    closed = []
    partial = PartialImage(0, 0, b"png")

    async def slow():
        try:
            yield partial
            await asyncio.sleep(10)
            yield ImageDone(0, b"png", RowStats(1, 1, 1.0, (1,), 0, 0.1))
        finally:
            closed.append(True)

    async def run() -> list:
        seen = []
        with pytest.raises(APIError) as caught:
            async for event in with_deadline(slow(), 0.2):
                seen.append(event)
        assert caught.value.status == 408 and caught.value.body()["error"]["code"] == "timeout"
        return seen

    assert asyncio.run(run()) == [partial]
    assert closed == [True]


def test_a_streamed_answer_sends_its_text_at_most_once_per_interval():
    """The same seeded chat through the engine loop, its text sent after every step (interval 0) and
    at most once per 60 s (its first text at once, the rest with the answer): the same answer, one
    text event before the answer instead of one per step."""
    from raydec.api.schedulers import CaptionScheduler
    from raydec.reference.shapes import sample_images
    from raydec.serve.boundary import ChatDone, TextDelta
    from raydec.serve.engine_loop import EngineLoop
    from raydec.serve.engine_host import ChatWatcher

    scheduler = CaptionScheduler("reference", {"method": "ar"}, batch_size=2)
    loop_ = EngineLoop(scheduler)
    loop_.start()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe the image ."}]}]
    image = sample_images([3])[0]

    def chat(interval: float) -> list:
        events: queue.SimpleQueue = queue.SimpleQueue()
        watcher = ChatWatcher(scheduler, lambda event, timing: events.put(event), True, (), 0, interval)
        loop_.submit(lambda: scheduler.submit(messages, [image], seed=5), watcher)
        seen = [events.get(timeout=60)]
        while not isinstance(seen[-1], ChatDone):
            seen.append(events.get(timeout=60))
        return seen

    try:
        every_step, sparse = chat(0.0), chat(60.0)
    finally:
        loop_.stop()
    for events in (every_step, sparse):
        deltas = [e.text for e in events if isinstance(e, TextDelta)]
        assert "".join(deltas) == events[-1].text and events[-1].completion_tokens > 4
    assert every_step[-1].text == sparse[-1].text
    assert len(every_step) >= every_step[-1].completion_tokens // 2  # AR: about a text event per token
    assert [type(e) for e in sparse] == [TextDelta, TextDelta, ChatDone]  # the first text, the rest, the answer
