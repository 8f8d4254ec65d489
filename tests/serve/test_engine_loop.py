"""The pieces under a replica, in this process: schedulers that take requests over time
(equal to the public functions, rows released so memory stays flat) and the engine loop whose
death fails the replica's health check."""

from __future__ import annotations

import asyncio

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


def test_health_check_fails_once_the_engine_loop_died(serve_app):
    """The replica class in this process (ray is up: its metrics need it)."""
    from raydec.serve.config import LimitsConfig, ServedModel
    from raydec.serve.replica import ImageReplica

    replica = ImageReplica(ServedModel(name="t", task="t2i", decode={"method": "ar"}), LimitsConfig())
    replica.check_health()  # alive

    async def kill() -> None:
        def fatal() -> None:
            raise SystemExit("a fault the loop cannot survive")

        replica.loop.call(fatal)
        for _ in range(100):
            if not replica.loop.alive:
                return
            await asyncio.sleep(0.05)

    asyncio.run(kill())
    with pytest.raises(RuntimeError, match="engine loop .* died"):
        replica.check_health()


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
    from raydec.serve.replica import ChatWatcher

    scheduler = CaptionScheduler("reference", {"method": "ar"}, batch_size=2)
    loop_ = EngineLoop(scheduler)
    loop_.start()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe the image ."}]}]
    image = sample_images([3])[0]

    async def chat(interval: float) -> list:
        events: asyncio.Queue = asyncio.Queue()
        watcher = ChatWatcher(scheduler, asyncio.get_running_loop(), events, True, (), 0, interval)
        loop_.submit(lambda: scheduler.submit(messages, [image], seed=5), watcher)
        seen = [await events.get()]
        while not isinstance(seen[-1], ChatDone):
            seen.append(await asyncio.wait_for(events.get(), 60))
        return seen

    try:
        every_step, sparse = asyncio.run(chat(0.0)), asyncio.run(chat(60.0))
    finally:
        loop_.stop()
    for events in (every_step, sparse):
        deltas = [e.text for e in events if isinstance(e, TextDelta)]
        assert "".join(deltas) == events[-1].text and events[-1].completion_tokens > 4
    assert every_step[-1].text == sparse[-1].text
    assert len(every_step) >= every_step[-1].completion_tokens // 2  # AR: about a text event per token
    assert [type(e) for e in sparse] == [TextDelta, TextDelta, ChatDone]  # the first text, the rest, the answer
