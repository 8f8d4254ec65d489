"""/v1/chat/completions through the official openai client: the caption ``caption_images``
gives for the same seed, streamed and not, alone and in a burst, and stop strings."""

from __future__ import annotations

import pytest

from tests.serve.helpers import chat_image_message, data_url, png_of

QUESTION = "describe the image ."


@pytest.fixture(scope="module")
def image():
    from raydec.reference.shapes import sample_images

    return sample_images([4242])[0]


@pytest.fixture(scope="module")
def expected(image):
    from raydec.api import caption_images

    return caption_images([image], QUESTION, decode={"method": "vispec", "sampling": {"temperature": 1.0}}, seeds=[21])[0]


def test_chat_answer_equals_caption_images(client, image, expected):
    response = client.chat.completions.create(model="vlm", messages=chat_image_message(data_url(png_of(image)), QUESTION),
                                              seed=21, temperature=1.0, extra_body={"method": "vispec"})
    choice = response.choices[0]
    assert choice.message.content == expected.caption
    assert choice.finish_reason == "stop"
    usage = response.usage
    assert usage.completion_tokens == expected.num_tokens and usage.prompt_tokens > 64
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.model_extra["accepted_lengths"] == expected.accepted_lengths
    assert usage.model_extra["target_forwards"] == expected.target_forwards


def test_a_seeded_chat_in_a_burst_gives_its_answer_alone(client, image, expected):
    """Three chats at once (the vlm model holds two and queues two: one place to spare, since Serve's count
    of a replica's queue lags a finished request; a refusal is retried): the seeded one's answer and
    accepted lengths are those it gets alone (float32: a row does not depend on the rows beside it)."""
    from concurrent.futures import ThreadPoolExecutor

    from raydec.reference.shapes import sample_images

    others = sample_images([7, 8])
    patient = client.with_options(max_retries=3)

    def ask(picture, seed: int):
        return patient.chat.completions.create(model="vlm", messages=chat_image_message(data_url(png_of(picture)), QUESTION),
                                              seed=seed, temperature=1.0, extra_body={"method": "vispec"})

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(ask, picture, seed) for picture, seed in ((others[0], 5), (image, 21), (others[1], 6))]
        burst = [future.result() for future in futures]
    assert burst[1].choices[0].message.content == expected.caption
    assert burst[1].usage.model_extra["accepted_lengths"] == expected.accepted_lengths


def test_streamed_chat_gives_the_same_answer_and_usage_last(client, image, expected):
    stream = client.chat.completions.create(model="vlm", messages=chat_image_message(data_url(png_of(image)), QUESTION),
                                            seed=21, temperature=1.0, stream=True, stream_options={"include_usage": True},
                                            extra_body={"method": "vispec"})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == expected.caption
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2  # text arrives as it commits
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == expected.num_tokens


def test_stop_string_ends_the_answer_before_it(client, image, expected):
    words = expected.caption.split()
    stop = " " + words[3] + " "
    assert stop.strip() in expected.caption
    response = client.chat.completions.create(model="vlm", messages=chat_image_message(data_url(png_of(image)), QUESTION),
                                              seed=21, temperature=1.0, stop=[stop], extra_body={"method": "vispec"})
    content = response.choices[0].message.content
    assert content == expected.caption[: expected.caption.find(stop)]
    assert response.choices[0].finish_reason == "stop"


def test_text_only_and_greedy_chat(client):
    first = client.chat.completions.create(model="vlm", messages=[{"role": "user", "content": QUESTION}], temperature=0,
                                           max_tokens=8)
    second = client.chat.completions.create(model="vlm", messages=[{"role": "user", "content": QUESTION}], temperature=0,
                                            max_tokens=8, seed=99)
    assert first.choices[0].message.content == second.choices[0].message.content  # greedy: the seed changes nothing
    assert first.usage.completion_tokens <= 8
