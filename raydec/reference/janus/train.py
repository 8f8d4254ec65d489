"""Training loops of the reference text-to-image Janus: data, VQ-VAE, language model, saving.

``train_t2i(settings)`` retrains everything from scratch, deterministically given
``settings.seed``: it renders shapes images, trains the VQ-VAE with the straight-through
forward of :mod:`raydec.reference.janus.model`, tokenises the images once (cached under the
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

Modules: the settings are :mod:`raydec.reference.janus.settings`, the block codes
:mod:`raydec.reference.janus.codes`, the two stages :mod:`raydec.reference.janus.vq` and
:mod:`raydec.reference.janus.lm`, their checkpoints :mod:`raydec.reference.janus.checkpoint`;
this module renders the data, runs the phases and saves the folder.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from raydec.reference.janus import model as jt
from raydec.reference.janus import pixels as px
from raydec.reference.janus.codes import BlockCodes, block_codes
from raydec.reference.janus.lm import train_lm
from raydec.reference.janus.settings import T2ISettings
from raydec.reference.janus.vq import train_vq
from raydec.reference.shapes import HELD_OUT_SEED_START, check_texture, make_sample, vocabulary

logger = logging.getLogger(__name__)


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
    pixels = px.images_to_pixels(torch.from_numpy(images[:count]))
    ids = px.vq_encode(model.model.vqmodel, pixels)  # [count, 256]
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
