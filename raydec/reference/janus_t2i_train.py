"""Training loops of the reference text-to-image Janus: data, VQ-VAE, language model, saving.

``train_t2i(settings)`` retrains everything from scratch, deterministically given
``settings.seed``: it renders shapes images, trains the VQ-VAE with the straight-through
forward of :mod:`raydec.reference.janus_t2i`, tokenises the images once (cached under the
work directory, never in the repository), trains the language model + generation head with
10% unconditional (CFG) prompts, and saves a ``from_pretrained`` folder with the processor,
the generation config, a loss-curve PNG and ``training_log.json``.
Checkpoints go to the work directory every few hundred steps; ``resume=True`` continues
from the last one after a crash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from raydec.reference import janus_t2i as jt
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, vocabulary

logger = logging.getLogger(__name__)

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "weights" / "t2i"


@dataclass
class T2ISettings:
    """Every knob of one from-scratch training run."""

    out_dir: Path = DEFAULT_OUT_DIR
    work_dir: Path = Path("/tmp/raydec_t2i_work")
    seed: int = 0
    num_images: int = 10_000
    vq_steps: int = 1900
    vq_batch_size: int = 8
    vq_crop: int = 32
    vq_full_image_steps: int = 150
    vq_continuous_steps: int = 1400
    vq_lr: float = 2e-3
    vq_color_weight: float = 3.0
    lm_steps: int = 850
    lm_batch_size: int = 16
    lm_lr: float = 1.5e-3
    lm_warmup: int = 100
    lm_weight_decay: float = 0.05
    uncond_share: float = 0.1
    max_extra_left_pad: int = 3
    guidance_scale: float = 3.0
    checkpoint_every: int = 200
    max_minutes: float = 0.0
    threads: int = 1
    resume: bool = False
    arch: jt.T2IArchitecture = field(default_factory=jt.T2IArchitecture)


# ----------------------------------------------------------------------------- data


def render_dataset(num_images: int, work_dir: Path) -> tuple[np.ndarray, list[str]]:
    """Images ``[N, 64, 64, 3]`` uint8 and prompts of training seeds ``0 .. N-1`` (cached)."""
    if num_images > HELD_OUT_SEED_START:
        raise ValueError(f"num_images={num_images} would reach held-out seeds >= {HELD_OUT_SEED_START}")
    image_file = work_dir / f"images_{num_images}.npy"
    prompt_file = work_dir / f"prompts_{num_images}.json"
    if image_file.exists() and prompt_file.exists():
        return np.load(image_file), json.loads(prompt_file.read_text())
    images = np.empty((num_images, jt.IMAGE_SIZE, jt.IMAGE_SIZE, 3), dtype=np.uint8)
    prompts: list[str] = []
    for seed in tqdm(range(num_images), desc="render shapes", mininterval=2):
        sample = make_sample(seed)
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


def _load_checkpoint(path: Path, modules: dict) -> tuple[int, list, dict]:
    """Restore a checkpoint written by ``_save_checkpoint``; returns (step, losses, extra)."""
    state = torch.load(path, weights_only=True)
    for name, obj in modules.items():
        obj.load_state_dict(state[name])
    torch.set_rng_state(state["torch_rng"])
    return state["step"], state["losses"], state["extra"]


# ----------------------------------------------------------------------------- VQ


def _patch_weights(pixels: torch.Tensor) -> torch.Tensor:
    """Sampling weight of each token position: 0.1 + mean chroma of its 4x4 patch. # [B * h * w]

    Objects (saturated colours) cover a small share of the patches while noisy backgrounds
    cover many; sampling codes by this weight keeps codes for every colour.
    """
    chroma = (pixels.max(dim=1, keepdim=True).values - pixels.min(dim=1, keepdim=True).values) / 2
    return (0.1 + F.avg_pool2d(chroma, jt.PATCH_SIZE)).flatten()


def _restart_dead_codes(
    vq: torch.nn.Module, usage: torch.Tensor, latents: torch.Tensor, weights: torch.Tensor, gen: torch.Generator
) -> int:
    """Re-seed never-used codes with current latents drawn by ``weights``; returns how many."""
    dead = (usage == 0).nonzero().flatten()
    if dead.numel() == 0:
        return 0
    flat = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
    pick = torch.multinomial(weights, dead.numel(), replacement=True, generator=gen)
    with torch.no_grad():
        vq.quantize.embedding.weight[dead] = flat[pick] + 0.01 * torch.randn(
            dead.numel(), flat.shape[1], generator=gen
        )
    return int(dead.numel())


@torch.no_grad()
def _kmeans_codebook(vq, images: np.ndarray, gen: torch.Generator, batches: int = 12, iterations: int = 15) -> None:
    """Weighted spherical k-means of current (normalised) latents of full images -> codebook.

    Run once when quantisation switches on, so every code starts where latents actually
    are; patches are weighted by :func:`_patch_weights` so object colours get codes.
    """
    latents, weights = [], []
    for _ in range(batches):
        index = torch.randint(0, images.shape[0], (8,), generator=gen).numpy()
        pixels = jt.images_to_pixels(torch.from_numpy(images[index]))
        encoded = jt._normalised_latents(vq, pixels)
        latents.append(encoded.permute(0, 2, 3, 1).reshape(-1, encoded.shape[1]))
        weights.append(_patch_weights(pixels))
    points, weight = torch.cat(latents), torch.cat(weights)  # [M, D], [M]
    codes = vq.quantize.embedding.weight.shape[0]
    centroids = points[torch.multinomial(weight, codes, replacement=False, generator=gen)].clone()
    for _ in range(iterations):
        assign = (points @ centroids.T).argmax(dim=1)
        sums = torch.zeros_like(centroids).index_add_(0, assign, points * weight[:, None])
        counts = torch.bincount(assign, minlength=codes)
        empty = counts == 0
        refill = points[torch.multinomial(weight, max(1, int(empty.sum())), replacement=True, generator=gen)]
        centroids = F.normalize(sums, dim=1)
        centroids[empty] = refill[: int(empty.sum())]
    vq.quantize.embedding.weight.copy_(centroids)
    logger.info("k-means codebook from %d latents (%d iterations)", points.shape[0], iterations)


def _vq_batch(images: np.ndarray, step: int, settings: T2ISettings, gen: torch.Generator) -> torch.Tensor:
    """Pixels ``[B, 3, S, S]`` in [-1, 1] for one VQ step.

    Most steps use random ``vq_crop`` crops aligned to the 4-pixel token grid (four times
    cheaper than full images; the network is convolutional), the last
    ``vq_full_image_steps`` steps full images (a quarter of the batch), so the normalisation
    statistics and the attention blocks end up tuned to the 64 x 64 images they will see.
    """
    full = step >= settings.vq_steps - settings.vq_full_image_steps or settings.vq_crop >= jt.IMAGE_SIZE
    count = max(1, settings.vq_batch_size // 4) if full else settings.vq_batch_size
    index = torch.randint(0, images.shape[0], (count,), generator=gen).numpy()
    if full:
        return jt.images_to_pixels(torch.from_numpy(images[index]))
    slots = (jt.IMAGE_SIZE - settings.vq_crop) // jt.PATCH_SIZE + 1
    offsets = torch.randint(0, slots, (count, 2), generator=gen).numpy() * jt.PATCH_SIZE
    crops = np.stack(
        [images[i, y : y + settings.vq_crop, x : x + settings.vq_crop] for i, (y, x) in zip(index, offsets)]
    )
    return jt.images_to_pixels(torch.from_numpy(crops))


def _reconstruction_loss(reconstruction: torch.Tensor, pixels: torch.Tensor, color_weight: float) -> torch.Tensor:
    """MSE + L1, with saturated (object) pixels weighted up by ``1 + color_weight * chroma``.

    Objects are a small share of the pixels; without the weight the decoder learns the
    achromatic background long before it learns the objects' colours.
    """
    chroma = (pixels.max(dim=1, keepdim=True).values - pixels.min(dim=1, keepdim=True).values) / 2  # [B, 1, H, W]
    weight = 1 + color_weight * chroma
    error = reconstruction - pixels
    return (weight * (error.square() + error.abs())).mean() / weight.mean()


def train_vq(model, images: np.ndarray, settings: T2ISettings, deadline: float) -> list[dict]:
    """Train ``model.model.vqmodel`` on ``images``; returns the per-step loss history."""
    vq = model.model.vqmodel
    vq.train()
    params = list(vq.encoder.parameters()) + list(vq.quant_conv.parameters()) + list(vq.quantize.parameters())
    params += list(vq.post_quant_conv.parameters()) + list(vq.decoder.parameters())
    optimizer = torch.optim.AdamW(params, lr=settings.vq_lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = settings.work_dir / "vq_checkpoint.pt"
    gen = torch.Generator().manual_seed(settings.seed + 1)
    start, losses = 0, []
    if settings.resume and ckpt.exists():
        start, losses, extra = _load_checkpoint(ckpt, {"vq": vq, "optimizer": optimizer})
        gen.set_state(extra["gen"])
        logger.info("resumed VQ training at step %d", start)
    usage = torch.zeros(vq.config.num_embeddings, dtype=torch.long)
    bar = tqdm(range(start, settings.vq_steps), desc="train VQ", initial=start, total=settings.vq_steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _cosine_lr(step, settings.vq_steps, settings.vq_lr, warmup=50)
        quantize = step >= settings.vq_continuous_steps
        if step == settings.vq_continuous_steps and step > 0:
            _kmeans_codebook(vq, images, gen)
        pixels = _vq_batch(images, step, settings, gen)
        reconstruction, vq_loss, ids = jt.vq_straight_through(vq, pixels, quantize=quantize)
        recon_loss = _reconstruction_loss(reconstruction, pixels, settings.vq_color_weight)
        loss = recon_loss + vq_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        usage += torch.bincount(ids.flatten(), minlength=usage.numel())
        record = {"step": step, "recon": recon_loss.item(), "vq": vq_loss.item()}
        if (step + 1) % 50 == 0:
            record["codes_used"] = int((usage > 0).sum())
            if quantize and step + 1 <= settings.vq_steps * 0.75:
                with torch.no_grad():
                    latents = jt._normalised_latents(vq, pixels)
                record["restarted"] = _restart_dead_codes(vq, usage, latents, _patch_weights(pixels), gen)
            usage.zero_()
            logger.info("VQ step %d: %s", step + 1, record)
        losses.append(record)
        bar.set_postfix(recon=f"{record['recon']:.4f}", vq=f"{record['vq']:.4f}")
        if (step + 1) % settings.checkpoint_every == 0:
            _save_checkpoint(ckpt, step + 1, {"vq": vq, "optimizer": optimizer}, losses, {"gen": gen.get_state()})
        if deadline and time.time() > deadline:
            logger.warning("VQ training stopped early at step %d (time limit)", step + 1)
            break
    _save_checkpoint(ckpt, len(losses), {"vq": vq, "optimizer": optimizer}, losses, {"gen": gen.get_state()})
    vq.eval()
    return losses


@torch.no_grad()
def tokenize_images(vq, images: np.ndarray, cache_file: Path, batch_size: int = 128) -> np.ndarray:
    """VQ token ids ``[N, 256]`` (int16) of every image, cached at ``cache_file``."""
    if cache_file.exists():
        return np.load(cache_file)
    vq.eval()
    ids = np.empty((images.shape[0], jt.NUM_IMAGE_TOKENS), dtype=np.int16)
    for begin in tqdm(range(0, images.shape[0], batch_size), desc="tokenise images", mininterval=2):
        chunk = torch.from_numpy(images[begin : begin + batch_size])
        ids[begin : begin + batch_size] = jt.vq_encode(vq, jt.images_to_pixels(chunk)).numpy()
    np.save(cache_file, ids)
    return ids


# ----------------------------------------------------------------------------- LM


def make_lm_batch(
    prompt_ids: list[list[int]],
    image_ids: np.ndarray,
    index: torch.Tensor,
    tokenizer,
    settings: T2ISettings,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts (ending in the image-start token), their mask and image ids.

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
    return ids, mask, torch.from_numpy(image_ids[index.numpy()].astype(np.int64))


def train_lm(model, tokenizer, prompts: list[str], image_ids: np.ndarray, settings: T2ISettings, deadline: float):
    """Train the language model + generation parts on prompt -> image tokens; returns losses."""
    vq = model.model.vqmodel
    for p in vq.parameters():
        p.requires_grad_(False)
    for p in model.model.vision_model.parameters():
        p.requires_grad_(False)
    with torch.no_grad():  # start the image-token embeddings at the VQ's (normalised) codes
        model.model.generation_embeddings.weight.copy_(F.normalize(vq.quantize.embedding.weight, dim=-1))
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.lm_weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lm_lr,
        betas=(0.9, 0.95),
    )
    prompt_ids = [tokenizer(p, add_special_tokens=True).input_ids for p in prompts]
    ckpt = settings.work_dir / "lm_checkpoint.pt"
    gen = torch.Generator().manual_seed(settings.seed + 2)
    start, losses = 0, []
    if settings.resume and ckpt.exists():
        start, losses, extra = _load_checkpoint(ckpt, {"model": model, "optimizer": optimizer})
        gen.set_state(extra["gen"])
        logger.info("resumed LM training at step %d", start)
    model.train()
    vq.eval()
    bar = tqdm(range(start, settings.lm_steps), desc="train LM", initial=start, total=settings.lm_steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _wsd_lr(step, settings.lm_steps, settings.lm_lr, settings.lm_warmup)
        index = torch.randint(0, len(prompts), (settings.lm_batch_size,), generator=gen)
        ids, mask, targets = make_lm_batch(prompt_ids, image_ids, index, tokenizer, settings, gen)
        loss = jt.lm_loss(model, ids, mask, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append({"step": step, "loss": loss.item()})
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % 100 == 0:
            recent = np.mean([r["loss"] for r in losses[-100:]])
            logger.info("LM step %d: mean loss (last 100) %.4f", step + 1, recent)
        if (step + 1) % settings.checkpoint_every == 0:
            _save_checkpoint(ckpt, step + 1, {"model": model, "optimizer": optimizer}, losses, {"gen": gen.get_state()})
        if deadline and time.time() > deadline:
            logger.warning("LM training stopped early at step %d (time limit)", step + 1)
            break
    _save_checkpoint(ckpt, len(losses), {"model": model, "optimizer": optimizer}, losses, {"gen": gen.get_state()})
    model.eval()
    return losses


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
    for key, colour in (("recon", "tab:blue"), ("vq", "tab:orange")):
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


def _fingerprint(module: torch.nn.Module) -> str:
    """Short hash of a module's weights (names the token cache of exactly this VQ)."""
    digest = hashlib.sha1()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().numpy().tobytes())
    return digest.hexdigest()[:12]


def _settings_json(settings: T2ISettings) -> dict:
    """JSON-friendly copy of the settings."""
    data = asdict(settings)
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}


def train_t2i(settings: T2ISettings) -> Path:
    """Retrain the reference T2I Janus from scratch and save it to ``settings.out_dir``."""
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    deadline = started + settings.max_minutes * 60 if settings.max_minutes else 0.0
    tokenizer = jt.build_tokenizer(vocabulary())
    processor = jt.build_processor(tokenizer)
    model = jt.build_model(jt.build_config(tokenizer, settings.arch), settings.seed)
    logger.info(
        "parameters: total %d, language model %d, VQ %d",
        jt.count_parameters(model),
        jt.count_parameters(model.model.language_model),
        jt.count_parameters(model.model.vqmodel),
    )
    images, prompts = render_dataset(settings.num_images, settings.work_dir)

    vq_started = time.time()
    vq_losses = train_vq(model, images, settings, deadline)
    vq_seconds = time.time() - vq_started
    tag = f"n{settings.num_images}_vq{_fingerprint(model.model.vqmodel)}"
    tokenize_started = time.time()
    image_ids = tokenize_images(model.model.vqmodel, images, settings.work_dir / f"image_ids_{tag}.npy")
    tokenize_seconds = time.time() - tokenize_started
    lm_started = time.time()
    lm_losses = train_lm(model, tokenizer, prompts, image_ids, settings, deadline)
    lm_seconds = time.time() - lm_started

    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = jt.build_generation_config(tokenizer, guidance_scale=settings.guidance_scale)
    for p in model.parameters():
        p.requires_grad_(True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    plot_losses(vq_losses, lm_losses, out / "loss_curve.png")
    log = {
        "settings": _settings_json(settings),
        "parameters": {
            "total": jt.count_parameters(model),
            "language_model": jt.count_parameters(model.model.language_model),
            "vq": jt.count_parameters(model.model.vqmodel),
        },
        "vq_steps_done": len(vq_losses),
        "lm_steps_done": len(lm_losses),
        "seconds": {"vq": vq_seconds, "tokenize": tokenize_seconds, "lm": lm_seconds, "total": time.time() - started},
        "final_vq_recon_loss_mean100": float(np.mean([r["recon"] for r in vq_losses[-100:]])),
        "final_lm_loss_mean100": float(np.mean([r["loss"] for r in lm_losses[-100:]])),
        "codes_used_last": next((r["codes_used"] for r in reversed(vq_losses) if "codes_used" in r), None),
    }
    (out / "training_log.json").write_text(json.dumps(log, indent=2))
    logger.info("saved the reference T2I model to %s (%.1f min)", out, (time.time() - started) / 60)
    return out
