"""What crosses between the ingress and a replica: jobs built from validated requests, events,
and both pickled as Ray pickles them (no Serve app needed)."""

from __future__ import annotations

import pickle

import pytest
from PIL import Image
from ray import cloudpickle

from raydec.serve.boundary import (ChatDone, ChatRequest, Failed, ImageDone, ImageRequest, ModelInfo, PartialImage, RowStats, Sampling,
                                   TextDelta)
from raydec.serve.protocol import ChatCompletionRequest, ImageGenerationRequest

STATS = RowStats(target_forwards=3, tokens=5, tokens_per_forward=1.6667, accepted_lengths=(2, 2, 1), seed=7, decode_s=0.5)


def test_image_job_from_a_validated_request():
    body = ImageGenerationRequest.model_validate({"prompt": "a red circle", "n": 2, "seed": 4, "temperature": 0.5, "top_k": 0,
                                                  "partial_images": 2, "size": "auto"})
    request = ImageRequest.from_request(body)
    assert request == ImageRequest(prompt="a red circle", n=2, seed=4, sampling=Sampling(temperature=0.5, top_k=0), size="auto")
    assert request.partial_images == 0  # not streamed: no partial images
    assert request.sampling.per_row() == {"temperature": 0.5, "top_k": 0}
    assert ImageRequest.from_request(body.model_copy(update={"stream": True})).partial_images == 2
    assert request.coupling is None and ImageRequest.from_request(body.model_copy(update={"coupling": "gumbel"})).coupling == "gumbel"
    assert Sampling().per_row() is None


def test_chat_job_from_a_validated_request():
    body = ChatCompletionRequest.model_validate({"model": "vlm", "messages": [{"role": "user", "content": "hi"}], "stop": "\n",
                                                 "max_tokens": 9, "max_completion_tokens": 5, "stream": True})
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    request = ChatRequest.from_request(body, messages, [])
    assert request.stop == ("\n",) and request.max_tokens == 5 and request.stream and request.messages == tuple(messages)
    assert request.coupling is None
    assert ChatRequest.from_request(body.model_copy(update={"coupling": "rejection"}), messages, []).coupling == "rejection"
    assert body.model_copy(update={"stop": None, "max_completion_tokens": None}).stop_strings() == ()
    assert body.model_copy(update={"max_completion_tokens": None}).new_tokens() == 9


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_jobs_and_events_pickle(dumps):
    image = Image.new("RGB", (4, 3), (10, 20, 30))
    values = [
        ImageRequest(prompt="x", n=3, seed=1, method="sjd", cfg_scale=3.0, sampling=Sampling(top_p=0.9), size="64x64", partial_images=1),
        ChatRequest(messages=({"role": "user", "content": [{"type": "image"}]},), images=(image,), stop=("a", "b"), max_tokens=4),
        PartialImage(0, 1, b"png"), ImageDone(1, b"png", STATS), TextDelta("hello"),
        ChatDone("hello", "stop", STATS, prompt_tokens=12, completion_tokens=5), Failed(0, 400, "too long", "invalid_value"),
        ModelInfo(task="t2i", method="sjd_pac", pid=1, size="64x64", sizes="64x64 only"),
    ]
    for value in values:
        assert pickle.loads(dumps(value)) == value


def test_row_stats_usage_is_json():
    assert STATS.usage() == {"target_forwards": 3, "tokens": 5, "tokens_per_forward": 1.6667, "accepted_lengths": [2, 2, 1],
                             "seed": 7, "decode_s": 0.5}
