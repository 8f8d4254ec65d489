"""``decode.coupling: gumbel`` makes a sampled row's tokens a function of its seed alone: the Serve app
returns, for a seed, the pixels ``generate_images`` gives with the Gumbel coupling, though the app's
model decodes with sjd in batches and ``generate_images`` with plain AR; a request may bring its own
coupling, and one that is none is a 400 naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from tests.serve.helpers import assert_envelope, call, chat_image_message, data_url, png_of, pixels, stats

PROMPT = "a red circle on the left"
SEEDS = [41, 42]
SAMPLED = {"temperature": 1.0}


@pytest.fixture(scope="module")
def gumbel_images():
    """generate_images in this process: plain AR under the Gumbel coupling, seeds 41 and 42."""
    from raydec.api import generate_images

    return [np.asarray(r.image) for r in generate_images([PROMPT] * 2, decode={"method": "ar", "coupling": "gumbel", "sampling": SAMPLED},
                                                         seeds=SEEDS)]


def test_a_gumbel_model_serves_the_images_of_the_seed_whatever_the_method(client, serve_app, gumbel_images):
    plan = stats(serve_app, "t2i-gumbel")["plan"]
    assert (plan["method"], plan["coupling"]) == ("sjd", "gumbel")
    assert stats(serve_app, "t2i")["plan"]["coupling"] == "gumbel"  # the default
    response = client.images.generate(prompt=PROMPT, model="t2i-gumbel", n=2, response_format="b64_json", extra_body={"seed": SEEDS[0]})
    assert [pixels(item.b64_json).tobytes() for item in response.data] == [image.tobytes() for image in gumbel_images]
    rows = response.usage.model_extra["images"]
    assert [row["seed"] for row in rows] == SEEDS and all(row["tokens_per_forward"] > 1 for row in rows)  # sjd drafted and accepted


def test_a_request_brings_its_own_coupling(client, gumbel_images):
    from raydec.api import generate_images

    # "t2i" decodes with sjd_pac under the default coupling, gumbel: the seed's image
    response = client.images.generate(prompt=PROMPT, model="t2i", response_format="b64_json",
                                      extra_body={"seed": SEEDS[1], "temperature": 1.0})
    assert np.array_equal(pixels(response.data[0].b64_json), gumbel_images[1])
    # a request under rejection sampling gets generate_images' row under it, not the seed's gumbel image
    response = client.images.generate(prompt=PROMPT, model="t2i-gumbel", response_format="b64_json",
                                      extra_body={"seed": SEEDS[0], "method": "ar", "coupling": "rejection"})
    (rejection,) = generate_images([PROMPT], decode={"method": "ar", "coupling": "rejection", "sampling": SAMPLED}, seeds=SEEDS[:1])
    assert np.array_equal(pixels(response.data[0].b64_json), np.asarray(rejection.image))
    assert not np.array_equal(np.asarray(rejection.image), gumbel_images[0])


def test_a_chat_brings_its_own_coupling(client):
    from raydec.api import caption_images
    from raydec.reference.shapes import sample_images

    image = sample_images([4243])[0]
    (expected,) = caption_images([image], "describe the image .", decode={"method": "ar", "coupling": "gumbel", "sampling": SAMPLED},
                                 seeds=[5])
    response = client.chat.completions.create(model="vlm", messages=chat_image_message(data_url(png_of(image))), seed=5,
                                              temperature=1.0, extra_body={"method": "vispec", "coupling": "gumbel"})
    assert response.choices[0].message.content == expected.caption
    assert response.usage.model_extra["tokens_per_forward"] > 1  # vispec drafted and accepted


@pytest.mark.parametrize("route, body", [
    ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "coupling": "maximal"}),
    ("/v1/chat/completions", {"model": "vlm", "messages": [{"role": "user", "content": "hi"}], "coupling": "Gumbel"}),
])
def test_a_coupling_that_is_none_is_a_400_naming_the_field(serve_app, route, body):
    status, answer, _ = call(serve_app["url"], route, body, key=serve_app["key"])
    assert_envelope(status, answer, 400, param="coupling")
    assert "'rejection' or 'gumbel'" in answer["error"]["message"]
