"""The language-model stage of the reference text-to-image training: batches, object targets, loop.

``train_lm`` trains the language model and generation head on prompt -> block codes with
unconditional (CFG) rows, object tokens weighted up and a training-only attribute probe that
must name each object's colour, shape and fill from the hidden states that draw it; a
warm-up / constant / decay learning rate and resumable checkpoints.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from raydec.reference.janus import model as jt
from raydec.reference.janus.checkpoint import load_checkpoint, save_checkpoint
from raydec.reference.janus.codes import BlockCodes
from raydec.reference.janus.settings import T2ISettings
from raydec.reference.judge.text import parse_prompt
from raydec.reference.shapes import COLORS, FILLS, GRID_BLOCKS, SHAPES, object_box

logger = logging.getLogger(__name__)


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


def _lm_optimizer(model, settings: T2ISettings) -> tuple[list, torch.optim.Optimizer]:
    """The trainable parameters and their AdamW (weight decay on matrices only)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.lm_weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lm_lr,
        betas=(0.9, 0.95),
    )
    return params, optimizer


def _attribute_probe(model, settings: T2ISettings) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    """The training-only attribute probe on the image-token hidden states, and its AdamW."""
    probe = torch.nn.Linear(model.config.text_config.hidden_size, sum(ATTRIBUTE_CLASSES))
    with torch.no_grad():
        probe.weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(settings.seed + 3))
        probe.bias.zero_()
    return probe, torch.optim.AdamW(probe.parameters(), lr=settings.lm_lr, betas=(0.9, 0.95), weight_decay=0.0)


def _log_progress(step: int, losses: list[dict]) -> None:
    """Log the mean loss (and attribute-probe loss) of the last 100 steps."""
    recent = np.mean([r["loss"] for r in losses[-100:]])
    probe_losses = [r["attribute_loss"] for r in losses[-100:] if "attribute_loss" in r]
    probe_text = f", attribute probe {np.mean(probe_losses):.4f}" if probe_losses else ""
    logger.info("LM step %d: mean loss (last 100) %.4f%s", step + 1, recent, probe_text)


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
    params, optimizer = _lm_optimizer(model, settings)
    prompt_ids = [tokenizer(p, add_special_tokens=True).input_ids for p in prompts]
    object_tokens = np.stack([object_token_mask(p) for p in prompts]) if settings.lm_object_weight != 1.0 else None
    modules = {"model": model, "optimizer": optimizer}
    if settings.lm_attribute_weight > 0:
        attribute_targets = np.stack([object_attribute_targets(p) for p in prompts])  # [N_train, 3, 256] int8
        probe, probe_optimizer = _attribute_probe(model, settings)
        modules.update(attribute_probe=probe, attribute_optimizer=probe_optimizer)
    ckpt = settings.work_dir / ("lm_checkpoint.pt" if settings.init_from is None else f"lm_checkpoint_{settings.texture}.pt")
    gen = torch.Generator().manual_seed(settings.seed + 2)
    start, losses, spent, began = 0, [], 0.0, time.time()
    if settings.resume and ckpt.exists():
        optional = ("attribute_probe", "attribute_optimizer")
        start, losses, extra = load_checkpoint(ckpt, modules, optional)
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
            _log_progress(step, losses)
        if (step + 1) % settings.checkpoint_every == 0:
            save_checkpoint(ckpt, step + 1, modules, losses, state())
        if deadline and time.time() > deadline:
            logger.warning("LM training stopped early at step %d (time limit)", step + 1)
            break
    save_checkpoint(ckpt, len(losses), modules, losses, state())
    model.eval()
    return losses, state()["seconds"]
