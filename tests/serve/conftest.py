"""One running raydec Serve app on 127.0.0.1 for the serving tests (started once for this folder):
the reference text-to-image model and the reference VLM in float32 (so a row's output does
not depend on which rows share its batch), with an API key, an https allow-list that names
loopback hosts (so the private-address refusal after DNS is what stops them) and small limits.
The reference models decode with their methods' default shapes; a tiny Janus ("t2i-auto", named by hub
id from a cache laid out as the hub lays it out, offline) leaves its batch size and draft shape to "auto"
and finds both in a shape cache seeded before the app starts (with one plan: ``follow_batch: false``); a
tiny Emu3 ("emu3") is served from a bucket on moto's server. "t2i-gumbel" decodes the reference model with sjd under the Gumbel
coupling and follows its live batch: its shape is "auto", and the cache holds a window per batch bucket."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from raydec.io.config import S3Config
from raydec.io.filesystem import s3_client
from tests.hub_cache import hub_layout
from tests.ray_fixture import REPO_ROOT, _free_ports
from tests.s3_fixture import upload_folder

API_KEY = "rk-test-7Hq2vX9pLm4Zt8Wc"  # the tests search every log line for it


#: the shape the seeded cache holds for "t2i-auto" at batch 2 (not a method default, so a decode shows it)
SEEDED_SHAPE = {"method": "sjd_pac", "jacobi": {"window": 8, "branching": 1, "tree_depth": 0, "init": "left"}, "draft_tree": None,
                "label": "window=8,init=left"}
#: the reference model decoding with sjd under the Gumbel coupling: a seed's image is generate_images' with plain AR
GUMBEL_MODEL = {"name": "t2i-gumbel", "task": "t2i",
                "decode": {"method": "sjd", "jacobi": "auto", "coupling": "gumbel", "sampling": {"temperature": 1.0}},
                "batch_size": 4, "cpus_per_worker": 0.25}
#: the sjd window the seeded cache holds for "t2i-gumbel" at each batch bucket: wide for one row, narrow for four
GUMBEL_WINDOWS = {1: 12, 2: 6, 4: 3}
AUTO_MODEL = {"name": "t2i-auto", "task": "t2i", "decode": {"method": "sjd_pac", "jacobi": "auto"}, "batch_size": "auto",
              "cpus_per_worker": 0.25, "follow_batch": False}


def window_shape(window: int) -> dict:
    """A cache record of sjd with ``window`` (fresh drafts uniform)."""
    jacobi = {"window": window, "branching": 1, "tree_depth": 0, "init": "uniform"}
    return {"method": "sjd", "jacobi": jacobi, "draft_tree": None, "label": f"window={window},init=uniform"}


def seed_shape_cache(served, shapes: dict | None = None) -> None:
    """Put ``shapes`` ({batch: shape record}; default SEEDED_SHAPE at batch 2, the only batch the cache then
    knows for the model, so 'auto' takes it) in this process's shape cache under the keys ``served``'s
    replica computes at those batches, as a tuning would have left them."""
    import torch

    from raydec.api import load_target, sized
    from raydec.api.draft_shapes import ShapeCache, apply_shape
    from raydec.api.tuner import ShapeTrial
    from raydec.config import DecodeConfig
    from raydec.runtime.planning import shape_cache_key

    for batch, shape in (shapes or {2: SEEDED_SHAPE}).items():
        config = served.model_copy(update={"batch_size": batch}).processor_config()
        target = sized(load_target(config.model, task="t2i", dtype=getattr(torch, config.dtype)), config.size)
        key = shape_cache_key(config, target)
        trials = [ShapeTrial(DecodeConfig(method="ar"), 10.0, 1.0), ShapeTrial(apply_shape(served.decode, shape), 12.0, 1.2)]
        ShapeCache().put(key, shape, trials)


#: the hub id "t2i-auto" names, and the commit its cache holds
JANUS_HUB_ID, JANUS_COMMIT = "org/tiny-janus", "c" * 40


@pytest.fixture(scope="package")
def serve_app(tmp_path_factory, moto_server) -> Iterator[dict]:
    """Yields {"url", "key", "config", "emu3", "janus"}: the app's base URL (routes under /v1), its key,
    the folder of the tiny Emu3 it also serves (as model "emu3" from s3://, at the sizes requests ask
    for) and of the tiny Janus it serves as "t2i-auto" (by hub id)."""
    import ray
    from ray import serve

    from raydec.commands.serve import start
    from raydec.runtime.cluster import init_local_ray
    from raydec.serve import ServeConfig

    from tests.t2i_toys import tiny_emu3, tiny_janus

    if ray.is_initialized():
        ray.shutdown()
    (port,) = _free_ports(1)
    emu3 = tiny_emu3(tmp_path_factory.mktemp("serve-emu3") / "ckpt", seed=0)
    janus = tiny_janus(tmp_path_factory.mktemp("serve-janus") / "ckpt")
    s3 = {"endpoint_url": moto_server, "access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
    s3_client(S3Config(**s3)).create_bucket(Bucket="serve-models")
    upload_folder(S3Config(**s3), "serve-models", "tiny-emu3", emu3)
    hub = tmp_path_factory.mktemp("serve-hf") / "hub"
    hub_layout(hub, JANUS_HUB_ID, {JANUS_COMMIT: janus}, JANUS_COMMIT)
    hub_env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    saved_env = {name: os.environ.get(name) for name in hub_env}
    os.environ.update(hub_env)  # this process seeds the shape cache for the hub id, as the replica will read it
    config = ServeConfig.model_validate({
        "port": port,
        "api_keys": [API_KEY],
        "api_keys_env": None,
        "models": [
            {"name": "t2i", "task": "t2i", "decode": {"method": "sjd_pac"}, "batch_size": 8, "max_ongoing_requests": 48,
             "max_queued_requests": 64, "health_check_period_s": 2.0},
            {"name": "vlm", "task": "caption", "decode": {"method": "vispec"}, "batch_size": 8,
             "max_ongoing_requests": 2, "max_queued_requests": 2},  # small: the overload test fills it
            {"name": "emu3", "task": "t2i", "model": "s3://serve-models/tiny-emu3", "s3": s3, "decode": {"method": "sjd_pac"},
             "batch_size": 4, "cpus_per_worker": 0.25},
            {**AUTO_MODEL, "model": JANUS_HUB_ID},
            GUMBEL_MODEL,
        ],
        "media": {"allowed_domains": ["localhost", "127.0.0.1"], "max_images_per_request": 2},
        "limits": {"max_request_bytes": 2 * 2**20, "max_n": 4, "request_timeout_s": 120, "header_timeout_s": 3.0,
                   "body_timeout_s": 5.0},
    })
    seed_shape_cache(config.model("t2i-auto"))
    seed_shape_cache(config.model("t2i-gumbel"), {batch: window_shape(window) for batch, window in GUMBEL_WINDOWS.items()})
    env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
                "RAYDEC_CACHE_DIR": os.environ["RAYDEC_CACHE_DIR"], **hub_env}
    init_local_ray(num_cpus=2, env_vars=env_vars, object_store_memory=300 * 2**20)
    try:
        url = start(config, ready_timeout_s=300)
        yield {"url": url, "key": API_KEY, "config": config, "emu3": emu3, "janus": janus}
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(scope="package")
def client(serve_app):
    """The official openai client, pointed at the app with its key."""
    from openai import OpenAI

    return OpenAI(base_url=serve_app["url"] + "/v1", api_key=serve_app["key"], max_retries=0, timeout=120)
