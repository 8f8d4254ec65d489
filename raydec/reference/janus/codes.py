"""The fixed tokenisation of the reference text-to-image model: k-means codes of pixel blocks.

A chroma-weighted k-means of raw 4 x 4 pixel blocks (one block = one image token) gives the
centroids; every block's nearest centroid is its id, the teacher of both the VQ-VAE stage
(:mod:`raydec.reference.janus.vq`, where the whole recipe is written down) and the
language-model stage (:mod:`raydec.reference.janus.lm`). ``block_codes`` caches them in
the work directory and fits them on "iid" images, so every texture shares one tokenisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from raydec.reference.janus import model as jt
from raydec.reference.janus.settings import T2ISettings
from raydec.reference.shapes import make_sample


def _blocks(images: np.ndarray) -> np.ndarray:
    """uint8 ``[N, 64, 64, 3]`` -> float32 ``[N, 256, 48]``: each token's 4 x 4 x 3 pixel block."""
    n, side, p = images.shape[0], jt.IMAGE_SIZE // jt.PATCH_SIZE, jt.PATCH_SIZE
    blocks = images.reshape(n, side, p, side, p, 3).transpose(0, 1, 3, 2, 4, 5)
    return blocks.reshape(n, side * side, p * p * 3).astype(np.float32)


def _block_weights(blocks: torch.Tensor) -> torch.Tensor:
    """k-means weight of each block: 0.05 + its mean chroma (objects are few, backgrounds many). # [M]"""
    pixels = blocks.view(blocks.shape[0], -1, 3)
    return 0.05 + (pixels.max(-1).values - pixels.min(-1).values).mean(-1) / 255.0


def block_centroids(images: np.ndarray, codes: int, iterations: int, gen: torch.Generator) -> torch.Tensor:
    """Weighted k-means of the images' pixel blocks -> ``[codes, 48]`` centroids (0..255)."""
    points = torch.from_numpy(_blocks(images).reshape(-1, jt.PATCH_SIZE**2 * 3))
    weight = _block_weights(points)
    centroids = points[torch.multinomial(weight, codes, replacement=False, generator=gen)].clone()
    for _ in tqdm(range(iterations), desc="k-means of pixel blocks", mininterval=2):
        distance = torch.cdist(points, centroids)  # [M, K]
        nearest, assign = distance.min(dim=1)
        sums = torch.zeros_like(centroids).index_add_(0, assign, points * weight[:, None])
        mass = torch.zeros(codes).index_add_(0, assign, weight)
        empty = mass == 0
        centroids = sums / mass.clamp_min(1e-8)[:, None]
        if empty.any():  # re-seed empty codes at badly served blocks
            pick = torch.multinomial(weight * nearest, int(empty.sum()), replacement=False, generator=gen)
            centroids[empty] = points[pick]
    return centroids


def block_ids(images: np.ndarray, centroids: torch.Tensor, batch_size: int = 500) -> np.ndarray:
    """Nearest-centroid id of every block: ``[N, 256]`` int16 (the encoder's teacher)."""
    ids = np.empty((images.shape[0], jt.NUM_IMAGE_TOKENS), dtype=np.int16)
    for begin in range(0, images.shape[0], batch_size):
        blocks = torch.from_numpy(_blocks(images[begin : begin + batch_size]))
        distance = torch.cdist(blocks.reshape(-1, blocks.shape[-1]), centroids)
        ids[begin : begin + batch_size] = distance.argmin(dim=1).view(blocks.shape[0], -1).numpy()
    return ids


def _codebook_from_centroids(centroids: torch.Tensor, dim: int, gen: torch.Generator) -> torch.Tensor:
    """Start code vectors as the centroids' top ``dim`` principal components (+ a little noise),
    so similar blocks start with similar codes. # [K, dim], unit norm"""
    centred = centroids - centroids.mean(dim=0)
    _, _, basis = torch.linalg.svd(centred, full_matrices=False)
    projected = centred @ basis[:dim].T
    projected = projected / projected.std(dim=0).clamp_min(1e-6)
    return F.normalize(projected + 0.1 * torch.randn(projected.shape, generator=gen), dim=1)


@dataclass
class BlockCodes:
    """The fixed tokenisation both stages learn: centroids ``[K, 48]`` and ids ``[N, 256]``."""

    centroids: torch.Tensor
    ids: np.ndarray

    def codebook(self, dim: int, seed: int) -> torch.Tensor:
        """Initial unit code vectors (deterministic given ``seed``). # [K, dim]"""
        return _codebook_from_centroids(self.centroids, dim, torch.Generator().manual_seed(seed))


def block_codes(images: np.ndarray, codes: int, settings: T2ISettings) -> BlockCodes:
    """k-means centroids of ``vq_kmeans_images`` training images and every image's ids (cached).

    The centroids always come from the "iid" rendering of the sampled seeds, so every texture
    shares one tokenisation (their blocks take the same values; only their arrangement differs).
    """
    suffix = "" if settings.texture == "iid" else f"_{settings.texture}"
    cache = settings.work_dir / (
        f"block_codes_n{images.shape[0]}_k{codes}_s{settings.seed}"
        f"_m{settings.vq_kmeans_images}_i{settings.vq_kmeans_iterations}{suffix}.npz"
    )
    if cache.exists():
        cached = np.load(cache)
        return BlockCodes(torch.from_numpy(cached["centroids"]), cached["ids"])
    iid_cache = cache.with_name(cache.name.replace(suffix, "")) if suffix else cache
    if iid_cache.exists():  # the same centroids: only the ids of this texture's images are new
        centroids = torch.from_numpy(np.load(iid_cache)["centroids"])
        ids = block_ids(images, centroids)
        np.savez(cache, centroids=centroids.numpy(), ids=ids)
        return BlockCodes(centroids, ids)
    gen = torch.Generator().manual_seed(settings.seed + 3)
    sample = torch.randperm(images.shape[0], generator=gen)[: settings.vq_kmeans_images].sort().values.numpy()
    if settings.texture == "iid":
        fit_images = images[sample]
    else:
        fit_images = np.stack([make_sample(int(seed)).image for seed in sample])
    centroids = block_centroids(fit_images, codes, settings.vq_kmeans_iterations, gen)
    ids = block_ids(images, centroids)
    np.savez(cache, centroids=centroids.numpy(), ids=ids)
    return BlockCodes(centroids, ids)
