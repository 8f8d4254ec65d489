"""The VQ-VAE stage of the reference text-to-image training: its recipe, batches, loss and loop.

``train_vq`` trains the decoder to draw the block codes' ids as pixels and the encoder to
read them back (cross-entropy on cosine logits against the codebook the stock HF decode
uses), on crops then full images, with a cosine learning rate and resumable checkpoints.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from raydec.reference.janus import model as jt
from raydec.reference.janus import pixels as px
from raydec.reference.janus.checkpoint import load_checkpoint, save_checkpoint
from raydec.reference.janus.codes import BlockCodes
from raydec.reference.janus.settings import T2ISettings

logger = logging.getLogger(__name__)

# Recipe: the codes are fixed first, the networks learn them. A chroma-weighted k-means of
# raw 4 x 4 pixel blocks (one block = one token) gives ``num_embeddings`` centroids whose
# block-by-block round trip already keeps the judge's attributes; every training block gets
# its nearest centroid as a "teacher" id. Then, jointly: the decoder learns ids -> pixels
# (regression on the original pixels, so it may sharpen what the centroid blurs), and the
# encoder learns pixels -> ids (cross-entropy on cosine logits against the same L2-normalised
# codebook that the stock ``get_codebook_entry`` / ``decode`` use). Neither network can
# collapse the codebook, and both are supervised from step 0.


def _cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.05) -> float:
    """Linear warm-up, then cosine decay to ``floor * peak`` (used for the VQ-VAE)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


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
    return px.images_to_pixels(torch.from_numpy(np.stack(pixels))), torch.from_numpy(np.stack(ids).astype(np.int64))


def _reconstruction_loss(reconstruction: torch.Tensor, pixels: torch.Tensor, color_weight: float) -> torch.Tensor:
    """MSE + L1, with saturated (object) pixels weighted up by ``1 + color_weight * chroma``.

    Objects are a small share of the pixels; without the weight the decoder learns the
    achromatic background long before it learns the objects' colours.
    """
    chroma = (pixels.max(dim=1, keepdim=True).values - pixels.min(dim=1, keepdim=True).values) / 2  # [B, 1, H, W]
    weight = 1 + color_weight * chroma
    error = reconstruction - pixels
    return (weight * (error.square() + error.abs())).mean() / weight.mean()


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
        start, losses, extra = load_checkpoint(ckpt, {"vq": vq, "optimizer": optimizer})
        gen.set_state(extra["gen"])
        spent = extra.get("seconds", 0.0)
        logger.info("resumed VQ training at step %d", start)
    state = lambda: {"gen": gen.get_state(), "seconds": spent + time.time() - began}  # noqa: E731
    bar = tqdm(range(start, settings.vq_steps), desc="train VQ", initial=start, total=settings.vq_steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _cosine_lr(step, settings.vq_steps, settings.vq_lr, warmup=50)
        pixels, ids = _vq_batch(images, codes.ids, step, settings, gen)  # [B, 3, S, S], [B, h, w]
        recon_loss = _reconstruction_loss(px.decode_codes(vq, ids), pixels, settings.vq_color_weight)
        logits = px.code_logits(vq, pixels, settings.vq_logit_scale)  # [B, K, h, w]
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
            save_checkpoint(ckpt, step + 1, {"vq": vq, "optimizer": optimizer}, losses, state())
        if deadline and time.time() > deadline:
            logger.warning("VQ training stopped early at step %d (time limit)", step + 1)
            break
    save_checkpoint(ckpt, len(losses), {"vq": vq, "optimizer": optimizer}, losses, state())
    vq.eval()
    return losses, state()["seconds"]
