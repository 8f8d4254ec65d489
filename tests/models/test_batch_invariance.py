"""A row's output does not depend on the rows beside it, end to end, on this machine's kernels.

float64, the shipped reference models, the public API: a row's PNG bytes (SJD-PAC) and caption
tokens (ViSpec) alone equal the same row's inside batches of 3 and 8 with other rows. Every
sampling decision draws from the row's own counter-based generator, and what a row computes
once (the draft's folded image bias) is a one-row product; the batched forwards round by batch
shape in the last bits, which float64 keeps far from any token decision.
"""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import raydec
from tests.ray_fixture import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return pq.read_table(EXAMPLES / "prompts.parquet").column("prompt").to_pylist()[:8]


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    return [Image.open(io.BytesIO(data)).convert("RGB") for data in pq.read_table(EXAMPLES / "images.parquet").column("image").to_pylist()[:8]]


def test_a_rows_png_bytes_are_the_same_alone_and_in_batches_of_3_and_8(prompts):
    target = raydec.load_target("reference", task="t2i", dtype=torch.float64)
    seeds = [101 + i for i in range(8)]

    def pngs(count: int) -> list[bytes]:
        results = raydec.generate_images(prompts[:count], model=target, decode={"method": "sjd_pac"}, seeds=seeds[:count], batch_size=8)
        assert all(r.target_forwards < r.num_tokens for r in results)  # drafted: windows were verified
        return [_png(r.image) for r in results]

    alone, three, eight = pngs(1), pngs(3), pngs(8)
    assert alone[0] == three[0] == eight[0]
    assert three == eight[:3]
    assert len(set(eight)) == 8


def test_a_rows_caption_tokens_are_the_same_alone_and_in_batches_of_3_and_8(images):
    target = raydec.load_target("reference", task="caption", dtype=torch.float64)
    seeds = [201 + i for i in range(8)]
    decode = {"method": "vispec", "sampling": {"temperature": 1.0}}

    def tokens(count: int) -> list[list[int]]:
        results = raydec.caption_images(images[:count], model=target, decode=decode, seeds=seeds[:count], batch_size=8)
        assert all(r.target_forwards < r.num_tokens for r in results)
        return [list(r.tokens) for r in results]

    alone, three, eight = tokens(1), tokens(3), tokens(8)
    assert alone[0] == three[0] == eight[0]
    assert three == eight[:3]
