"""/v1/images/generations through the official openai client against the running app: the same
pixels as ``generate_images`` for the same seed and method, progressive partial images, and
requests from many clients decoded in shared batches."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from tests.serve.helpers import call, pixels, stats

PROMPT = "a red circle on the left"


@pytest.fixture(scope="module")
def reference_images():
    """generate_images in this process, float32, seeds 11 and 12, sjd_pac."""
    from raydec.api import generate_images

    return generate_images([PROMPT, PROMPT], decode={"method": "sjd_pac"}, seeds=[11, 12])


def test_images_equal_generate_images_for_the_same_seed(client, reference_images):
    response = client.images.generate(prompt=PROMPT, model="t2i", n=2, response_format="b64_json",
                                      extra_body={"seed": 11, "method": "sjd_pac"})
    assert len(response.data) == 2
    for item, expected in zip(response.data, reference_images):
        assert np.array_equal(pixels(item.b64_json), np.asarray(expected.image))
    rows = response.usage.model_extra["images"]
    assert [row["seed"] for row in rows] == [11, 12]
    for row, expected in zip(rows, reference_images):
        assert row["target_forwards"] == expected.target_forwards
        assert row["accepted_lengths"] == expected.accepted_lengths
        assert 1 + sum(row["accepted_lengths"]) == row["tokens"] == 256
        assert row["tokens_per_forward"] == pytest.approx(256 / row["target_forwards"], rel=1e-3)


def test_streamed_image_sends_partials_then_the_same_image(client, reference_images):
    stream = client.images.generate(prompt=PROMPT, model="t2i", stream=True, partial_images=3,
                                    extra_body={"seed": 11, "method": "sjd_pac"})
    events = list(stream)
    kinds = [event.type for event in events]
    partials = [event for event in events if event.type == "image_generation.partial_image"]
    assert len(partials) >= 2, kinds
    assert kinds[-1] == "image_generation.completed" and kinds.count("image_generation.completed") == 1
    assert [event.partial_image_index for event in partials] == list(range(len(partials)))
    final = pixels(events[-1].b64_json)
    assert np.array_equal(final, np.asarray(reference_images[0].image))
    first = pixels(partials[0].b64_json)
    assert first.shape == final.shape
    grey = np.all(first == 128, axis=2).all(axis=1)  # rows not yet decoded are grey
    assert grey[-1] and not grey[0]
    assert events[-1].usage.output_tokens == 256


def test_a_client_that_disconnects_cancels_its_row(client, serve_app):
    before = stats(serve_app, "t2i")
    stream = client.images.generate(prompt=PROMPT, model="t2i", stream=True, partial_images=3,
                                    extra_body={"seed": 8, "method": "ar"})
    next(iter(stream))  # the first partial image: the row is decoding
    stream.response.close()  # the client goes away
    deadline = time.monotonic() + 30
    while True:
        now = stats(serve_app, "t2i")
        if now["cancelled"] > before["cancelled"] and now["active_rows"] == 0:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.1)
    assert now["rows"] == before["rows"]  # it never finished


def test_concurrent_requests_all_succeed_in_shared_batches(serve_app):
    """32 clients at once: every request gets its image, and decode steps carried several rows."""
    from openai import AsyncOpenAI

    before = stats(serve_app, "t2i")

    async def load() -> list:
        client = AsyncOpenAI(base_url=serve_app["url"] + "/v1", api_key=serve_app["key"], max_retries=0, timeout=300)
        requests = [client.images.generate(prompt=f"a blue square at the top {i}", model="t2i",
                                           extra_body={"seed": i, "method": "ar"}) for i in range(32)]
        try:
            return await asyncio.gather(*requests)
        finally:
            await client.close()

    responses = asyncio.run(load())
    assert len(responses) == 32
    assert all(pixels(r.data[0].b64_json).shape == (64, 64, 3) for r in responses)
    after = stats(serve_app, "t2i")
    steps = after["decode_steps"] - before["decode_steps"]
    rows = after["rows_stepped"] - before["rows_stepped"]
    assert steps > 0 and rows / steps > 1.0, (rows, steps)
    assert after["rows"] - before["rows"] == 32


def test_a_request_sent_while_a_batch_decodes_joins_it(client, serve_app):
    """B arrives after A has started decoding; some decode step then holds both rows."""
    before = stats(serve_app, "t2i")
    started, results = threading.Event(), {}

    def first() -> None:
        events = []
        for event in client.images.generate(prompt=PROMPT, model="t2i", stream=True, partial_images=3,
                                            extra_body={"seed": 5, "method": "ar"}):
            events.append(event)
            started.set()  # A's first partial image: A is decoding
        results["a"] = events

    thread = threading.Thread(target=first)
    thread.start()
    assert started.wait(60), "A never started decoding"
    results["b"] = client.images.generate(prompt="a green cross", model="t2i", extra_body={"seed": 6, "method": "ar"})
    thread.join(120)
    assert results["a"][-1].type == "image_generation.completed"
    assert results["b"].data[0].b64_json
    after = stats(serve_app, "t2i")
    steps = after["decode_steps"] - before["decode_steps"]
    rows = after["rows_stepped"] - before["rows_stepped"]
    assert rows > steps, "no decode step held A and B together"


def test_an_emu3_serves_the_sizes_requests_ask_for(serve_app):
    """`size` reaches the model: 32x32 and 16x24 images from a tiny Emu3 (one token per 8x8
    pixels) in one app, each what generate_images makes at that size; a size it cannot make is a
    400 naming the sizes it can."""
    from raydec.api import generate_images

    url, key = serve_app["url"], serve_app["key"]
    for size, shape in (("32x32", (32, 32, 3)), ("16x24", (24, 16, 3))):
        status, body, _ = call(url, "/v1/images/generations", {"prompt": "a red circle", "model": "emu3", "size": size,
                                                               "seed": 4}, key=key)
        assert status == 200 and body["size"] == size, body
        image = pixels(body["data"][0]["b64_json"])
        assert image.shape == shape
        (expected,) = generate_images(["a red circle"], model=str(serve_app["emu3"]), decode={"method": "sjd_pac"}, seeds=[4],
                                      size=size)
        assert np.array_equal(image, np.asarray(expected.image))
    status, body, _ = call(url, "/v1/images/generations", {"prompt": "a red circle", "model": "emu3", "size": "20x20"}, key=key)
    assert status == 400 and "multiples of 8 pixels" in body["error"]["message"], body
    status, body, _ = call(url, "/v1/images/generations", {"prompt": "a red circle", "model": "emu3", "size": "big"}, key=key)
    assert status == 400 and body["error"]["param"] == "size", body
