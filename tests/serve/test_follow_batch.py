"""A replica that follows its live batch ("t2i-gumbel": sjd with ``jacobi: auto`` under the Gumbel
coupling, a window per batch bucket from the seeded shape cache) switches its plan with the load, and
a seeded request gives the same image decoded alone and inside a burst of concurrent requests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tests.serve.conftest import GUMBEL_WINDOWS
from tests.serve.helpers import pixels, stats

PROMPTS = ["a red circle on the left", "two blue squares", "a green triangle", "a yellow square on the right"]
SEED = 314


def _image(client, prompt: str, seed: int) -> np.ndarray:
    response = client.images.generate(prompt=prompt, model="t2i-gumbel", response_format="b64_json", extra_body={"seed": seed})
    return pixels(response.data[0].b64_json)


def test_a_seed_gives_its_image_alone_and_in_a_burst_while_the_plan_follows_the_batch(client, serve_app):
    labels = {batch: f"sjd window={window},init=uniform" for batch, window in GUMBEL_WINDOWS.items()}
    before = stats(serve_app, "t2i-gumbel")
    assert before["live_plan"]["buckets"] == {str(batch): label for batch, label in labels.items()}
    assert (before["method"], before["shape"], before["plan"]["shape_from"]) == ("sjd", "window=3,init=uniform", "cache")
    assert stats(serve_app, "t2i-auto")["live_plan"] is None  # follow_batch: false

    alone = _image(client, PROMPTS[0], SEED)
    after_alone = stats(serve_app, "t2i-gumbel")["live_plan"]
    assert after_alone["plan_in_use"] == labels[1]

    seeds = [SEED + 1 + i for i in range(7)]
    seeds[3] = SEED
    with ThreadPoolExecutor(len(seeds)) as pool:
        futures = [pool.submit(_image, client, PROMPTS[0] if seed == SEED else PROMPTS[i % len(PROMPTS)], seed)
                   for i, seed in enumerate(seeds)]
        burst = [future.result() for future in futures]
    assert np.array_equal(burst[3], alone)

    live = stats(serve_app, "t2i-gumbel")["live_plan"]
    steps, earlier = live["steps_per_plan"], after_alone["steps_per_plan"]
    assert steps.get(labels[4], 0) > earlier.get(labels[4], 0)  # the burst filled the batch: the narrow window decoded
    assert live["switches"] > after_alone["switches"]
