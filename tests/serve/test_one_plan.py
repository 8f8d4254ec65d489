"""One decode config, one plan, one output: the default config (``{"method": "sjd_pac"}``, sampled
as the reference checkpoint samples) decodes with the same plan and the same pixels through
``generate_images``, ``raydec generate`` and the Serve app (a batch job: tests/runtime/test_runtime.py's
``test_a_job_with_the_default_config_decodes_with_the_plan_and_pixels_of_generate_images``)."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from tests.serve.helpers import pixels, stats

PROMPTS = ["a red circle on the left", "two blue squares"]
SEEDS = [21, 22]


def test_the_default_config_has_one_plan_and_one_output_at_every_entry_point(client, serve_app, tmp_path):
    from raydec.api import generate_images
    from raydec.cli import main

    decode = {"method": "sjd_pac"}  # no shape named: the method's default, everywhere
    api = generate_images(PROMPTS, decode=decode, seeds=SEEDS)
    assert api[0].plan == "sjd_pac window=16,init=uniform" and all(r.plan == api[0].plan for r in api)
    expected = [np.asarray(r.image) for r in api]

    assert main(["generate", *PROMPTS, "--method", "sjd_pac", "--seed", str(SEEDS[0]), "--out", str(tmp_path / "cli")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "cli" / "results.jsonl").read_text().splitlines()]
    assert [r["plan"] for r in rows] == [api[0].plan] * 2
    assert all(np.array_equal(np.asarray(Image.open(r["image"]).convert("RGB")), e) for r, e in zip(rows, expected))

    served = stats(serve_app, "t2i")["plan"]  # the app's "t2i" config: {"method": "sjd_pac"}, batch_size 8
    assert (served["label"], served["shape_from"], served["batch_size"]) == (api[0].plan, "default", 8)
    for prompt, seed, image in zip(PROMPTS, SEEDS, expected):
        response = client.images.generate(prompt=prompt, model="t2i", response_format="b64_json", extra_body={"seed": seed})
        assert np.array_equal(pixels(response.data[0].b64_json), image)


def test_the_plan_records_the_decode_configs_coupling():
    """A plan's coupling is its decode config's, a resumed job's plan (a recorded shape) included: what a
    manifest, a result and /v1/raydec/stats keep (the app's: tests/serve/test_coupling.py)."""
    from raydec.api.plan import plan_decode
    from raydec.config import DecodeConfig

    assert plan_decode(DecodeConfig(method="sjd"), 4).record()["coupling"] == "gumbel"  # the default
    assert plan_decode(DecodeConfig(method="sjd", coupling="rejection"), 4).record()["coupling"] == "rejection"
    plan = plan_decode(DecodeConfig(method="sjd", coupling="gumbel"), 4)
    assert plan.coupling == plan.record()["coupling"] == "gumbel"
    resumed = plan_decode(DecodeConfig(method="sjd_pac", jacobi="auto", coupling="gumbel"), 4, recorded={"method": "ar"})
    assert (resumed.decode.method, resumed.shape_from, resumed.record()["coupling"]) == ("ar", "manifest", "gumbel")
