"""Training loops of the reference text-to-image Janus: data, VQ-VAE, language model, saving.

``train_t2i(settings)`` retrains everything from scratch, deterministically given
``settings.seed``: it renders shapes images, trains the VQ-VAE with the straight-through
forward of :mod:`raydec.reference.janus_t2i`, tokenises the images once (cached under the
work directory, never in the repository), trains the language model + generation head with
10% unconditional (CFG) prompts, and saves a ``from_pretrained`` folder with the processor,
the generation config, a loss-curve PNG and ``training_log.json``.
Checkpoints go to the work directory every few hundred steps; ``resume=True`` continues
from the last one after a crash.

``settings.texture`` picks the world's texture (:mod:`raydec.reference.shapes`); the block
codes (the tokenisation) are always fitted on the "iid" images, whose blocks take the same
values, so one VQ-VAE serves both textures. The default recipe (the shipped weights) has two
phases: the whole model trains on "iid" images, then its language model continues for
``texture_steps`` on "runs" images. ``settings.init_from`` runs the second phase alone from a
saved folder (its VQ-VAE is kept as is).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from raydec.reference import janus_t2i as jt
from raydec.reference.judge_text import parse_prompt
from raydec.reference.shapes import (
    COLORS,
    FILLS,
    GRID_BLOCKS,
    HELD_OUT_SEED_START,
    SHAPES,
    check_texture,
    make_sample,
    object_box,
    vocabulary,
)

logger = logging.getLogger(__name__)

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "weights" / "t2i"


@dataclass
class T2ISettings:
    """Every knob of one from-scratch training run."""

    out_dir: Path = DEFAULT_OUT_DIR
    work_dir: Path = Path("/tmp/raydec_t2i_work")
    seed: int = 0
    num_images: int = 30_000
    vq_steps: int = 8000
    vq_batch_size: int = 8
    vq_crop: int = 32
    vq_full_image_steps: int = 150
    vq_kmeans_images: int = 3000
    vq_kmeans_iterations: int = 25
    vq_logit_scale: float = 20.0
    vq_code_weight: float = 0.2
    vq_lr: float = 2e-3
    vq_color_weight: float = 3.0
    lm_steps: int = 4600
    lm_batch_size: int = 16
    lm_lr: float = 1.5e-3
    lm_warmup: int = 100
    lm_weight_decay: float = 0.05
    # Tokens inside an object's box carry the prompt's colour, shape and fill; the other ~92%
    # are background a model learns by copying its neighbours. From step ``lm_object_weight_from``
    # on, object tokens weigh ``lm_object_weight`` in the LM loss (1.0: plain cross-entropy).
    lm_object_weight: float = 4.0
    lm_object_weight_from: int = 2800
    # The colour / shape / fill words are needed at one token per object (the first one drawn;
    # the rest copy their neighbours), too sparse a signal for the model to learn to read them.
    # From ``lm_attribute_from`` on, a linear probe on the hidden state that draws each
    # object-box token must name that object's colour, shape and fill (cross-entropy, weight
    # ``lm_attribute_weight``; 0: off). The probe is training-only and not saved.
    lm_attribute_weight: float = 0.5
    lm_attribute_from: int = 2800
    uncond_share: float = 0.1
    max_extra_left_pad: int = 3
    guidance_scale: float = 3.0
    checkpoint_every: int = 200
    max_minutes: float = 0.0
    threads: int = 1
    resume: bool = False
    # The world's texture ("iid" or "runs", see raydec.reference.shapes). Not "iid" and
    # texture_steps > 0: train on "iid" first, then continue the LM texture_steps on it.
    texture: str = "runs"
    texture_steps: int = 1000
    texture_lr: float = 5e-4
    texture_warmup: int = 50
    # A saved T2I folder: continue its language model (the VQ-VAE is kept; no VQ stage).
    init_from: Path | None = None
    arch: jt.T2IArchitecture = field(default_factory=jt.T2IArchitecture)


# ----------------------------------------------------------------------------- data


def render_dataset(num_images: int, work_dir: Path, texture: str = "iid") -> tuple[np.ndarray, list[str]]:
    """Images ``[N, 64, 64, 3]`` uint8 and prompts of training seeds ``0 .. N-1`` (cached)."""
    if num_images > HELD_OUT_SEED_START:
        raise ValueError(f"num_images={num_images} would reach held-out seeds >= {HELD_OUT_SEED_START}")
    suffix = "" if check_texture(texture) == "iid" else f"_{texture}"
    image_file = work_dir / f"images_{num_images}{suffix}.npy"
    prompt_file = work_dir / f"prompts_{num_images}.json"
    if image_file.exists() and prompt_file.exists():
        return np.load(image_file), json.loads(prompt_file.read_text())
    images = np.empty((num_images, jt.IMAGE_SIZE, jt.IMAGE_SIZE, 3), dtype=np.uint8)
    prompts: list[str] = []
    for seed in tqdm(range(num_images), desc=f"render shapes ({texture})", mininterval=2):
        sample = make_sample(seed, texture=texture)
        images[seed] = sample.image
        prompts.append(sample.prompt)
    work_dir.mkdir(parents=True, exist_ok=True)
    np.save(image_file, images)
    prompt_file.write_text(json.dumps(prompts))
    return images, prompts


def _cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.05) -> float:
    """Linear warm-up, then cosine decay to ``floor * peak`` (used for the VQ-VAE)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _wsd_lr(step: int, total: int, peak: float, warmup: int, decay_share: float = 0.2, floor: float = 0.05) -> float:
    """Warm-up, constant, then linear decay over the last ``decay_share`` of steps.

    The constant phase does not depend on ``total``, so a run resumed with a smaller
    ``total`` (before its decay began) equals a fresh run with that ``total``.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    decay_start = int(total * (1 - decay_share))
    if step < decay_start:
        return peak
    progress = (step - decay_start) / max(1, total - decay_start)
    return peak * (1 - (1 - floor) * min(1.0, progress))


def _save_checkpoint(path: Path, step: int, modules: dict, losses: list, extra: dict | None = None) -> None:
    """Write state dicts + step + loss history atomically (``torch.load(weights_only=True)`` safe)."""
    state = {name: obj.state_dict() for name, obj in modules.items()}
    state.update(step=step, losses=losses, torch_rng=torch.get_rng_state(), extra=extra or {})
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def _load_checkpoint(path: Path, modules: dict, optional: Sequence[str] = ()) -> tuple[int, list, dict]:
    """Restore a checkpoint written by ``_save_checkpoint``; returns (step, losses, extra).

    Modules named in ``optional`` keep their current state when the checkpoint lacks them
    (a run that adds a training-only part resumes from one written before it existed).
    """
    state = torch.load(path, weights_only=True)
    for name, obj in modules.items():
        if name not in state and name in optional:
            logger.info("checkpoint %s has no %r; it starts fresh", path, name)
            continue
        obj.load_state_dict(state[name])
    torch.set_rng_state(state["torch_rng"])
    return state["step"], state["losses"], state["extra"]


# ----------------------------------------------------------------------------- VQ
#
# Recipe: the codes are fixed first, the networks learn them. A chroma-weighted k-means of
# raw 4 x 4 pixel blocks (one block = one token) gives ``num_embeddings`` centroids whose
# block-by-block round trip already keeps the judge's attributes; every training block gets
# its nearest centroid as a "teacher" id. Then, jointly: the decoder learns ids -> pixels
# (regression on the original pixels, so it may sharpen what the centroid blurs), and the
# encoder learns pixels -> ids (cross-entropy on cosine logits against the same L2-normalised
# codebook that the stock ``get_codebook_entry`` / ``decode`` use). Neither network can
# collapse the codebook, and both are supervised from step 0.


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


def _vq_batch(
    images: np.ndarray, teacher: np.ndarray, step: int, settings: T2ISettings, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixels ``[B, 3, S, S]`` in [-1, 1] and teacher ids ``[B, S/4, S/4]`` for one VQ step.

    Most steps use random ``vq_crop`` crops aligned to the token grid (the networks are
    convolutional); the last ``vq_full_image_steps`` use full images (a quarter of the batch)
    so normalisation statistics and attention end up tuned to 64 x 64.
    """
    full = step >= settings.vq_steps - settings.vq_full_image_steps or settings.vq_crop >= jt.IMAGE_SIZE
    count = max(1, settings.vq_batch_size // 4) if full else settings.vq_batch_size
    crop = jt.IMAGE_SIZE if full else settings.vq_crop
    side, cells = jt.IMAGE_SIZE // jt.PATCH_SIZE, crop // jt.PATCH_SIZE
    index = torch.randint(0, images.shape[0], (count,), generator=gen).numpy()
    offsets = torch.randint(0, side - cells + 1, (count, 2), generator=gen).numpy()
    pixels, ids = [], []
    for i, (by, bx) in zip(index, offsets):
        y, x = by * jt.PATCH_SIZE, bx * jt.PATCH_SIZE
        pixels.append(images[i, y : y + crop, x : x + crop])
        ids.append(teacher[i].reshape(side, side)[by : by + cells, bx : bx + cells])
    return jt.images_to_pixels(torch.from_numpy(np.stack(pixels))), torch.from_numpy(np.stack(ids).astype(np.int64))


def _reconstruction_loss(reconstruction: torch.Tensor, pixels: torch.Tensor, color_weight: float) -> torch.Tensor:
    """MSE + L1, with saturated (object) pixels weighted up by ``1 + color_weight * chroma``.

    Objects are a small share of the pixels; without the weight the decoder learns the
    achromatic background long before it learns the objects' colours.
    """
    chroma = (pixels.max(dim=1, keepdim=True).values - pixels.min(dim=1, keepdim=True).values) / 2  # [B, 1, H, W]
    weight = 1 + color_weight * chroma
    error = reconstruction - pixels
    return (weight * (error.square() + error.abs())).mean() / weight.mean()


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


def train_vq(model, images: np.ndarray, codes: BlockCodes, settings: T2ISettings, deadline: float) -> list[dict]:
    """Train ``model.model.vqmodel`` on ``images`` (recipe above).

    Returns the per-step history and the training seconds (summed over resumed processes).
    """
    vq = model.model.vqmodel
    vq.train()
    params = list(vq.parameters())
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=settings.vq_lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = settings.work_dir / "vq_checkpoint.pt"
    gen = torch.Generator().manual_seed(settings.seed + 1)
    with torch.no_grad():
        vq.quantize.embedding.weight.copy_(codes.codebook(vq.config.embed_dim, settings.seed))
    start, losses, spent, began = 0, [], 0.0, time.time()
    if settings.resume and ckpt.exists():
        start, losses, extra = _load_checkpoint(ckpt, {"vq": vq, "optimizer": optimizer})
        gen.set_state(extra["gen"])
        spent = extra.get("seconds", 0.0)
        logger.info("resumed VQ training at step %d", start)
    state = lambda: {"gen": gen.get_state(), "seconds": spent + time.time() - began}  # noqa: E731
    bar = tqdm(range(start, settings.vq_steps), desc="train VQ", initial=start, total=settings.vq_steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _cosine_lr(step, settings.vq_steps, settings.vq_lr, warmup=50)
        pixels, ids = _vq_batch(images, codes.ids, step, settings, gen)  # [B, 3, S, S], [B, h, w]
        recon_loss = _reconstruction_loss(jt.decode_codes(vq, ids), pixels, settings.vq_color_weight)
        logits = jt.code_logits(vq, pixels, settings.vq_logit_scale)  # [B, K, h, w]
        code_loss = F.cross_entropy(logits, ids)
        loss = recon_loss + settings.vq_code_weight * code_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        accuracy = (logits.argmax(dim=1) == ids).float().mean().item()
        record = {"step": step, "recon": recon_loss.item(), "code": code_loss.item(), "code_accuracy": accuracy}
        losses.append(record)
        bar.set_postfix(recon=f"{record['recon']:.4f}", code=f"{record['code']:.3f}", acc=f"{accuracy:.3f}")
        if (step + 1) % 50 == 0:
            logger.info("VQ step %d: %s", step + 1, record)
        if (step + 1) % settings.checkpoint_every == 0:
            _save_checkpoint(ckpt, step + 1, {"vq": vq, "optimizer": optimizer}, losses, state())
        if deadline and time.time() > deadline:
            logger.warning("VQ training stopped early at step %d (time limit)", step + 1)
            break
    _save_checkpoint(ckpt, len(losses), {"vq": vq, "optimizer": optimizer}, losses, state())
    vq.eval()
    return losses, state()["seconds"]


# ----------------------------------------------------------------------------- LM


def make_lm_batch(
    prompt_ids: list[list[int]],
    image_ids: np.ndarray,
    index: torch.Tensor,
    tokenizer,
    settings: T2ISettings,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts (ending in the image-start token), their mask, image ids, and
    which rows were made unconditional (``[B]`` bool).

    ~``uncond_share`` of rows become the unconditional CFG row of HF Janus ``generate``
    (all but BOS / BOI replaced by pad, still attended). A few extra left pads vary the
    absolute positions, as batching prompts of different lengths does at generation time.
    """
    boi = tokenizer.convert_tokens_to_ids(jt.BOI_TOKEN)
    rows = [prompt_ids[i] + [boi] for i in index.tolist()]
    width = max(len(r) for r in rows) + int(torch.randint(0, settings.max_extra_left_pad + 1, (1,), generator=gen))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, tokens in enumerate(rows):
        ids[row, width - len(tokens) :] = torch.tensor(tokens)
        mask[row, width - len(tokens) :] = 1
    uncond = torch.rand(len(rows), generator=gen) < settings.uncond_share
    blank = jt.unconditional_ids(ids, tokenizer.bos_token_id, boi, tokenizer.pad_token_id)
    ids = torch.where(uncond[:, None], blank, ids)
    return ids, mask, torch.from_numpy(image_ids[index.numpy()].astype(np.int64)), uncond


ATTRIBUTE_CLASSES = (len(COLORS), len(SHAPES), len(FILLS))
IGNORE = -100


def object_attribute_targets(prompt: str) -> np.ndarray:
    """``[3, 256]`` int8: colour / shape / fill index of the object whose box holds each image
    token (raster order); ``IGNORE`` outside every box."""
    targets = np.full((3, GRID_BLOCKS, GRID_BLOCKS), IGNORE, dtype=np.int8)
    block = jt.IMAGE_SIZE // GRID_BLOCKS
    for obj in parse_prompt(prompt).objects:
        x0, y0, side = object_box(obj.position, obj.size, jt.IMAGE_SIZE)
        cells = (slice(y0 // block, (y0 + side) // block), slice(x0 // block, (x0 + side) // block))
        for row, value in enumerate((list(COLORS).index(obj.color), SHAPES.index(obj.shape), FILLS.index(obj.fill))):
            targets[(row, *cells)] = value
    return targets.reshape(3, -1)


def object_token_mask(prompt: str) -> np.ndarray:
    """``[256]`` bool: the image tokens inside the boxes of the prompt's objects (raster order)."""
    return object_attribute_targets(prompt)[0] != IGNORE


def attribute_loss(probe: torch.nn.Linear, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed colour + shape + fill cross-entropy of ``probe(hidden)``, mean over labelled tokens.

    hidden: ``[B, N, H]``; targets: ``[B, 3, N]`` (``IGNORE`` where no object is).
    """
    logits = probe(hidden).float().split(ATTRIBUTE_CLASSES, dim=-1)  # 3 x [B, N, C_k]
    return sum(
        F.cross_entropy(part.reshape(-1, part.shape[-1]), targets[:, k].reshape(-1), ignore_index=IGNORE)
        for k, part in enumerate(logits)
    )


def train_lm(model, tokenizer, prompts: list[str], codes: BlockCodes, settings: T2ISettings, deadline: float):
    """Train the language model + generation parts on prompt -> block codes; returns losses.

    Returns the per-step history and the training seconds (summed over resumed processes).
    The targets are the block codes themselves (what the VQ decoder was trained to draw), not
    the encoder's ids: they are a purely local function of each 4 x 4 block, so a flat region
    always gets the same code and the model's entropy sits where the world is random.
    """
    vq = model.model.vqmodel
    for p in vq.parameters():
        p.requires_grad_(False)
    for p in model.model.vision_model.parameters():
        p.requires_grad_(False)
    if settings.init_from is None:
        with torch.no_grad():  # start the image-token embeddings where the VQ codebook starts
            model.model.generation_embeddings.weight.copy_(codes.codebook(vq.config.embed_dim, settings.seed))
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.lm_weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lm_lr,
        betas=(0.9, 0.95),
    )
    prompt_ids = [tokenizer(p, add_special_tokens=True).input_ids for p in prompts]
    object_tokens = np.stack([object_token_mask(p) for p in prompts]) if settings.lm_object_weight != 1.0 else None
    modules = {"model": model, "optimizer": optimizer}
    if settings.lm_attribute_weight > 0:
        attribute_targets = np.stack([object_attribute_targets(p) for p in prompts])  # [N_train, 3, 256] int8
        probe = torch.nn.Linear(model.config.text_config.hidden_size, sum(ATTRIBUTE_CLASSES))
        with torch.no_grad():
            probe.weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(settings.seed + 3))
            probe.bias.zero_()
        probe_optimizer = torch.optim.AdamW(probe.parameters(), lr=settings.lm_lr, betas=(0.9, 0.95), weight_decay=0.0)
        modules.update(attribute_probe=probe, attribute_optimizer=probe_optimizer)
    ckpt = settings.work_dir / ("lm_checkpoint.pt" if settings.init_from is None else f"lm_checkpoint_{settings.texture}.pt")
    gen = torch.Generator().manual_seed(settings.seed + 2)
    start, losses, spent, began = 0, [], 0.0, time.time()
    if settings.resume and ckpt.exists():
        optional = ("attribute_probe", "attribute_optimizer")
        start, losses, extra = _load_checkpoint(ckpt, modules, optional)
        gen.set_state(extra["gen"])
        spent = extra.get("seconds", 0.0)
        logger.info("resumed LM training at step %d", start)
    state = lambda: {"gen": gen.get_state(), "seconds": spent + time.time() - began}  # noqa: E731
    model.train()
    vq.eval()
    bar = tqdm(range(start, settings.lm_steps), desc="train LM", initial=start, total=settings.lm_steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _wsd_lr(step, settings.lm_steps, settings.lm_lr, settings.lm_warmup)
        index = torch.randint(0, len(prompts), (settings.lm_batch_size,), generator=gen)
        ids, mask, targets, uncond = make_lm_batch(prompt_ids, codes.ids, index, tokenizer, settings, gen)
        hidden = jt.image_token_hidden(model, ids, mask, targets)  # [B, N, H]
        logits = model.model.generation_head(hidden).float()  # [B, N, K]
        token_ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [B, N]
        weights = torch.ones_like(token_ce)
        if object_tokens is not None and step >= settings.lm_object_weight_from:
            on_object = torch.from_numpy(object_tokens[index.numpy()])
            weights = weights.masked_fill(on_object, settings.lm_object_weight)
        loss = (token_ce * weights).sum() / weights.sum()
        record = {"step": step, "loss": token_ce.mean().item()}
        probing = settings.lm_attribute_weight > 0 and step >= settings.lm_attribute_from
        if probing:  # unconditional rows have no words to read: no attribute targets
            attr_targets = torch.from_numpy(attribute_targets[index.numpy()]).long().masked_fill(uncond[:, None, None], IGNORE)
            attr_loss = attribute_loss(probe, hidden, attr_targets)
            loss = loss + settings.lm_attribute_weight * attr_loss
            record["attribute_loss"] = attr_loss.item()
            probe_optimizer.zero_grad(set_to_none=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if probing:
            probe_optimizer.step()
        # "loss": plain cross-entropy per token (comparable across weightings); "objective": all terms
        losses.append({**record, "objective": loss.item()})
        bar.set_postfix(loss=f"{token_ce.mean().item():.3f}")
        if (step + 1) % 100 == 0:
            recent = np.mean([r["loss"] for r in losses[-100:]])
            probe_losses = [r["attribute_loss"] for r in losses[-100:] if "attribute_loss" in r]
            probe_text = f", attribute probe {np.mean(probe_losses):.4f}" if probe_losses else ""
            logger.info("LM step %d: mean loss (last 100) %.4f%s", step + 1, recent, probe_text)
        if (step + 1) % settings.checkpoint_every == 0:
            _save_checkpoint(ckpt, step + 1, modules, losses, state())
        if deadline and time.time() > deadline:
            logger.warning("LM training stopped early at step %d (time limit)", step + 1)
            break
    _save_checkpoint(ckpt, len(losses), modules, losses, state())
    model.eval()
    return losses, state()["seconds"]


# ----------------------------------------------------------------------------- outputs


def plot_losses(vq_losses: list[dict], lm_losses: list[dict], path: Path) -> None:
    """Two-panel loss curve PNG (raw and smoothed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def smooth(values: list[float], width: int = 25) -> np.ndarray:
        if len(values) < width:
            return np.asarray(values)
        return np.convolve(values, np.ones(width) / width, mode="valid")

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, colour in (("recon", "tab:blue"), ("code", "tab:orange")):
        values = [r[key] for r in vq_losses]
        axes[0].plot(values, color=colour, alpha=0.25)
        axes[0].plot(np.arange(len(smooth(values))) + min(24, len(values) - 1), smooth(values), color=colour, label=key)
    axes[0].set(title="VQ-VAE", xlabel="step", ylabel="loss", yscale="log")
    axes[0].legend()
    values = [r["loss"] for r in lm_losses]
    axes[1].plot(values, color="tab:green", alpha=0.25)
    axes[1].plot(np.arange(len(smooth(values))) + min(24, len(values) - 1), smooth(values), color="tab:green")
    axes[1].set(title="LM: image-token cross-entropy", xlabel="step", ylabel="nats / token")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _settings_json(settings: T2ISettings) -> dict:
    """JSON-friendly copy of the settings."""
    data = asdict(settings)
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}


def check_tokenisation(model, images: np.ndarray, codes: BlockCodes, count: int = 32, floor: float = 0.9) -> float:
    """Share of blocks the model's VQ encoder maps to the block codes' ids (first ``count``
    images); a ValueError below ``floor``: continuing a model on another tokenisation would
    teach it the wrong codes."""
    pixels = jt.images_to_pixels(torch.from_numpy(images[:count]))
    ids = jt.vq_encode(model.model.vqmodel, pixels)  # [count, 256]
    agreement = float((ids.numpy() == codes.ids[:count]).mean())
    if agreement < floor:
        raise ValueError(
            f"init_from model's VQ encoder agrees with the block codes on {agreement:.3f} of blocks "
            f"(need >= {floor}): it was trained on another tokenisation (seed, k-means settings)"
        )
    return agreement


def _load_init(settings: T2ISettings):
    """The saved model to continue, in float32 and training-ready."""
    from transformers import JanusForConditionalGeneration

    folder = Path(settings.init_from)
    if not (folder / "config.json").is_file():
        raise ValueError(f"init_from={str(folder)!r} is not a saved T2I folder (no config.json)")
    return JanusForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)


def train_t2i(settings: T2ISettings, stages: Sequence[str] = ("vq", "lm")) -> Path:
    """Retrain the reference T2I Janus from scratch and save it to ``settings.out_dir``.

    ``stages`` may name one of ``"vq"`` / ``"lm"``: that stage trains to its checkpoint in
    the work directory and nothing is saved (two processes can then use two cores); a later
    run of both stages with ``resume=True`` finds them finished and assembles the model.

    With a texture other than "iid" and ``texture_steps > 0`` (the default) that is phase one,
    on "iid" images, saved to ``work_dir / "iid_model"``; phase two continues its language
    model for ``texture_steps`` on the texture's images (lr ``texture_lr``, object weight and
    attribute probe from its first step) and saves to ``out_dir``. With ``settings.init_from``
    only phase two runs, from that folder.
    """
    check_texture(settings.texture)
    if settings.init_from is not None:
        return _train_phase(_phase_two(settings, settings.init_from), stages)
    if settings.texture == "iid" or settings.texture_steps == 0:
        return _train_phase(settings, stages)
    iid_dir = settings.work_dir / "iid_model"
    if not (settings.resume and (iid_dir / "config.json").is_file()):
        done = _train_phase(replace(settings, texture="iid", out_dir=iid_dir), stages)
        if set(stages) != {"vq", "lm"}:
            return done
    return _train_phase(_phase_two(settings, iid_dir), ("vq", "lm"), check_codes=False)  # this run's codes


def _phase_two(settings: T2ISettings, init_from: Path) -> T2ISettings:
    """The settings of the LM continuation on ``settings.texture``'s images."""
    logger.info("the language model of %s continues %d steps on %r images", init_from, settings.texture_steps, settings.texture)
    return replace(
        settings, init_from=Path(init_from), lm_steps=settings.texture_steps, lm_lr=settings.texture_lr,
        lm_warmup=settings.texture_warmup, lm_object_weight_from=0, lm_attribute_from=0,
    )  # fmt: skip


def _train_phase(settings: T2ISettings, stages: Sequence[str], check_codes: bool = True) -> Path:
    """One training run: from scratch on ``settings.texture``, or (``init_from``) the LM
    continued from a saved folder. ``check_codes``: verify the folder's VQ encoder agrees with
    the block codes (off when this run made both)."""
    check_texture(settings.texture)
    continuing = settings.init_from is not None
    if continuing and set(stages) == {"vq"}:
        raise ValueError("init_from keeps the saved VQ-VAE: there is no vq stage to train")
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    deadline = started + settings.max_minutes * 60 if settings.max_minutes else 0.0
    tokenizer = jt.build_tokenizer(vocabulary())
    processor = jt.build_processor(tokenizer)
    if continuing:
        model = _load_init(settings)
    else:
        model = jt.build_model(jt.build_config(tokenizer, settings.arch), settings.seed)
    logger.info(
        "parameters: total %d, language model %d, VQ %d",
        jt.count_parameters(model),
        jt.count_parameters(model.model.language_model),
        jt.count_parameters(model.model.vqmodel),
    )
    images, prompts = render_dataset(settings.num_images, settings.work_dir, settings.texture)
    codes_started = time.time()
    codes = block_codes(images, settings.arch.vq_num_embeddings, settings)
    codes_seconds = time.time() - codes_started
    if continuing and check_codes:
        logger.info("init_from VQ encoder agrees with the block codes on %.3f of blocks", check_tokenisation(model, images, codes))
    # The stages are independent given the block codes. The LM checkpoint holds the whole
    # model, so the LM stage runs first and the VQ's own checkpoint is loaded over it.
    lm_losses, lm_seconds = train_lm(model, tokenizer, prompts, codes, settings, deadline) if "lm" in stages else ([], 0)
    train_vq_stage = "vq" in stages and not continuing
    vq_losses, vq_seconds = train_vq(model, images, codes, settings, deadline) if train_vq_stage else ([], 0)
    if set(stages) != {"vq", "lm"}:
        logger.info("stage(s) %s done; run again with --resume (all stages) to assemble the model", ",".join(stages))
        return settings.work_dir

    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = jt.build_generation_config(tokenizer, guidance_scale=settings.guidance_scale)
    for p in model.parameters():
        p.requires_grad_(True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    plot_losses(vq_losses, lm_losses, out / "loss_curve.png")
    mean100 = lambda rows, key: float(np.mean([r[key] for r in rows[-100:]])) if rows else None  # noqa: E731
    log = {
        "settings": _settings_json(settings),
        "parameters": {
            "total": jt.count_parameters(model),
            "language_model": jt.count_parameters(model.model.language_model),
            "vq": jt.count_parameters(model.model.vqmodel),
        },
        "vq_steps_done": len(vq_losses),
        "lm_steps_done": len(lm_losses),
        "seconds": {"block_codes": codes_seconds, "vq": vq_seconds, "lm": lm_seconds},
        "final_vq_recon_loss_mean100": mean100(vq_losses, "recon"),
        "final_lm_loss_mean100": mean100(lm_losses, "loss"),
        "final_vq_code_accuracy_mean100": mean100(vq_losses, "code_accuracy"),
    }
    if continuing:
        init_log = Path(settings.init_from) / "training_log.json"
        log["init_from"] = json.loads(init_log.read_text()) if init_log.is_file() else str(settings.init_from)
    (out / "training_log.json").write_text(json.dumps(log, indent=2))
    logger.info("saved the reference T2I model to %s (%.1f min)", out, (time.time() - started) / 60)
    return out
