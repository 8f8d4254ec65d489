"""Models named where users keep them: a hub id (through a cache laid out as the hub lays it out, with
``HF_HUB_OFFLINE=1``) and ``s3://`` (moto's server), decoded as the same checkpoint named by its folder;
fetched once per node, whole or not at all; identified by commit and ETags."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raydec.cli import main
from raydec.models.sources import ModelSourceError, folder_identity, model_folder, model_identity
from tests.hub_cache import hub_layout
from tests.s3_fixture import moto_requests, upload_folder

MAIN_COMMIT = "b" * 40
OLD_COMMIT = "a" * 40


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny Janus checkpoints (two seeds: two commits of one repository) and a tiny LLaVA, saved by path."""
    from tests.t2i_toys import tiny_janus
    from tests.vlm_toys import build_tiny_llava

    root = tmp_path_factory.mktemp("checkpoints")
    return {"janus": tiny_janus(root / "janus", seed=0), "janus_old": tiny_janus(root / "janus-old", seed=1),
            "llava": build_tiny_llava(root / "llava")}


@pytest.fixture(scope="module")
def hub_cache(checkpoints, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("hf") / "hub"
    hub_layout(cache, "org/tiny-janus", {MAIN_COMMIT: checkpoints["janus"], OLD_COMMIT: checkpoints["janus_old"]}, MAIN_COMMIT)
    hub_layout(cache, "org/tiny-llava", {MAIN_COMMIT: checkpoints["llava"]}, MAIN_COMMIT)
    return cache


@pytest.fixture()
def offline_hub(hub_cache, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def pixels(folder: Path) -> list[np.ndarray]:
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    return [np.asarray(Image.open(row["image"]).convert("RGB")) for row in rows]


def test_generate_and_caption_by_hub_id_decode_as_the_folder(offline_hub, checkpoints, tmp_path, capsys):
    flags = ["--method", "sjd_pac", "--shape", "default", "--dtype", "float64", "--seed", "3", "a red circle", "a blue square"]
    assert main(["generate", "--model", "org/tiny-janus", "--out", str(tmp_path / "hub"), *flags]) == 0
    assert main(["generate", "--model", str(checkpoints["janus"]), "--out", str(tmp_path / "folder"), *flags]) == 0
    assert main(["generate", "--model", f"org/tiny-janus@{OLD_COMMIT}", "--out", str(tmp_path / "old"), *flags]) == 0
    assert main(["generate", "--model", str(checkpoints["janus_old"]), "--out", str(tmp_path / "old-folder"), *flags]) == 0
    hub, folder, old, old_folder = (pixels(tmp_path / name) for name in ("hub", "folder", "old", "old-folder"))
    assert all(np.array_equal(a, b) for a, b in zip(hub, folder)) and all(np.array_equal(a, b) for a, b in zip(old, old_folder))
    assert not np.array_equal(hub[0], old[0])  # the revision picked the other snapshot

    from raydec.reference.shapes import sample_images

    image = tmp_path / "shape.png"
    sample_images([3])[0].save(image)
    capsys.readouterr()
    captions = []
    for model in ("org/tiny-llava", str(checkpoints["llava"])):
        assert main(["caption", "--model", model, "--method", "ar", "--dtype", "float64", "--max-new-tokens", "8", str(image)]) == 0
        captions.append(capsys.readouterr().out)
    assert captions[0] == captions[1] and captions[0].strip()


def test_an_uncached_hub_id_is_one_line_naming_it_and_the_cache(offline_hub, tmp_path, capsys):
    assert main(["generate", "--model", "org/not-cached", "--out", str(tmp_path / "o"), "x"]) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "'org/not-cached'" in error and str(offline_hub) in error and "HF_HUB_OFFLINE" in error
    with pytest.raises(ModelSourceError, match="org/tiny-janus@c0ffee"):
        model_folder("org/tiny-janus@c0ffee")


def test_hub_identity_is_the_snapshot_commit_from_the_name_or_the_folder(offline_hub):
    assert model_identity("org/tiny-janus") == f"hub:org/tiny-janus@{MAIN_COMMIT}"
    assert model_identity(f"org/tiny-janus@{OLD_COMMIT}") == f"hub:org/tiny-janus@{OLD_COMMIT}"
    assert folder_identity(model_folder("org/tiny-janus")) == model_identity("org/tiny-janus")


def test_an_s3_model_is_fetched_once_whole_and_again_when_an_object_changes(checkpoints, s3_config, s3_bucket, tmp_path, monkeypatch):
    """Configs first (a driver's checks), then the weights: every object is read once; the copy
    records its identity; a new ETag is a new identity and a new copy, and loads the new bytes."""
    from raydec.io.filesystem import s3_client

    monkeypatch.setenv("RAYDEC_CACHE_DIR", str(tmp_path / "cache"))
    keys = upload_folder(s3_config, s3_bucket, "models/tiny-janus", checkpoints["janus"])
    (weights,) = [key for key in keys if key.endswith(".safetensors")]
    s3_client(s3_config).put_object(Bucket=s3_bucket, Key="models/tiny-janus/pytorch_model.bin", Body=b"other format")
    name = f"s3://{s3_bucket}/models/tiny-janus/"
    configs = model_folder(name, s3=s3_config, files="config")
    assert (configs / "config.json").is_file() and not list(configs.glob("*.safetensors"))
    whole = model_folder(name, s3=s3_config)
    assert model_folder(name, s3=s3_config) == whole  # reused
    assert sorted(p.relative_to(whole).as_posix() for p in whole.rglob("*") if p.is_file() and p.name != ".raydec-source.json") == \
        sorted(key.removeprefix("models/tiny-janus/") for key in keys)  # no pytorch_model.bin: one weight format
    gets = moto_requests("GET", f"/{s3_bucket}/models/tiny-janus/")
    assert sorted(gets) == sorted(f"/{s3_bucket}/{key}" for key in keys)  # each object once, configs included
    identity = model_identity(name, s3=s3_config)
    assert identity.startswith("s3:") and folder_identity(whole) == identity
    assert (whole / "model.safetensors").read_bytes() == (Path(checkpoints["janus"]) / "model.safetensors").read_bytes()

    s3_client(s3_config).put_object(Bucket=s3_bucket, Key=weights, Body=(Path(checkpoints["janus_old"]) / "model.safetensors").read_bytes())
    assert model_identity(name, s3=s3_config) != identity
    fresh = model_folder(name, s3=s3_config)
    assert fresh != whole and folder_identity(fresh) == model_identity(name, s3=s3_config)
    assert (fresh / "model.safetensors").read_bytes() == (Path(checkpoints["janus_old"]) / "model.safetensors").read_bytes()


def test_a_process_killed_while_downloading_leaves_no_model_and_the_next_fetch_is_whole(checkpoints, s3_config, s3_bucket, tmp_path,
                                                                                       monkeypatch):
    """A fetch killed mid-download (SIGKILL: no cleanup runs) leaves only a partial folder, which is
    never a model; the next fetch removes it and decodes as the folder does."""
    from raydec.api import generate_images

    padded = tmp_path / "padded"
    shutil.copytree(checkpoints["janus"], padded)
    (padded / "training_state.dat").write_bytes(os.urandom(48 << 20))  # a large file the loader does not read: a long download
    upload_folder(s3_config, s3_bucket, "models/padded", padded)
    name, cache = f"s3://{s3_bucket}/models/padded", tmp_path / "cache"
    env = {**os.environ, "RAYDEC_CACHE_DIR": str(cache)}
    code = (f"from raydec.io.config import S3Config; from raydec.models.sources import model_folder; "
            f"model_folder({name!r}, s3=S3Config(**{s3_config.model_dump(mode='json')!r}))")
    process = subprocess.Popen([sys.executable, "-c", code], env=env)
    root = cache / "models" / "s3" / s3_bucket / "models" / "padded"
    deadline = time.monotonic() + 60
    while not any(root.glob(".*.partial-*/*")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert any(root.glob(".*.partial-*")), "the download was not under way when the process was killed"
    assert not [p for p in root.iterdir() if not p.name.startswith(".")], "a killed download left a folder a load would take"

    monkeypatch.setenv("RAYDEC_CACHE_DIR", str(cache))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_config.endpoint_url)  # generate_images reads a bucket with the AWS environment
    folder = model_folder(name, s3=s3_config)
    from_bucket = generate_images(["a red circle"], model=name, decode={"method": "ar"}, seeds=[4])
    assert not any(root.glob(".*.partial-*")) and (folder / "training_state.dat").stat().st_size == 48 << 20
    expected = generate_images(["a red circle"], model=str(checkpoints["janus"]), decode={"method": "ar"}, seeds=[4])
    assert np.array_equal(np.asarray(from_bucket[0].image), np.asarray(expected[0].image))
