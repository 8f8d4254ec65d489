"""Training loop of the reference VLM: teacher forcing, loss on answer tokens only, AdamW, bf16 autocast.

Writes into ``out_dir``: the HF checkpoint (safetensors, config, tokenizer, processor,
generation config), ``train_log.json`` (per-step losses, quick evals, wall time) and
``loss_curve.png``. Checkpoints are rewritten every ``eval_every`` steps, so an interrupted run
still leaves usable weights.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.llava.data import PATCH_WORDS, training_batch
from raydec.reference.llava.model import VLMSizes, build_model, build_processor, extend_vocabulary
from raydec.reference.llava.settings import TrainLog, TrainSettings
from raydec.reference.shapes import vocabulary
from raydec.reference.shapes.dense import dense_vocabulary

logger = logging.getLogger(__name__)


def learning_rate(step: int, settings: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = min(1.0, (step - settings.warmup) / max(1, settings.steps - settings.warmup))
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return settings.lr * (settings.min_lr_ratio + (1 - settings.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, settings: TrainSettings) -> torch.optim.Optimizer:
    """AdamW with no weight decay on norms, biases and embeddings.

    Each group carries ``lr_mult``: ``settings.vision_lr_mult`` for the vision tower and the
    projector, 1 for the language model.
    """
    buckets: dict[tuple[bool, float], list] = {}
    for name, param in model.named_parameters():
        no_decay = param.ndim < 2 or "embed" in name or "norm" in name
        mult = 1.0
        if "vision_tower" in name or "multi_modal_projector" in name:
            mult = settings.vision_lr_mult
        if "multi_modal_projector.linear_1" in name:
            mult *= settings.projector_in_lr_mult
        buckets.setdefault((no_decay, mult), []).append(param)
    groups = [
        {"params": params, "weight_decay": 0.0 if no_decay else settings.weight_decay, "lr_mult": mult}
        for (no_decay, mult), params in sorted(buckets.items())
    ]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95), eps=1e-8)


def patch_loss(logits: torch.Tensor, input_ids: torch.Tensor, image_token_id: int, word_ids: torch.Tensor,
               patch_targets: torch.Tensor) -> torch.Tensor:
    """Auxiliary loss: at each image-token position, the LM head's logits of the patch words.

    A multi-label (sigmoid) cross-entropy over the columns ``word_ids`` against the patch's
    word tags. It gives the vision tower and the language model a dense, local signal about
    what each patch shows, which breaks the long plateau in which captions are written from
    the language prior alone. It trains the stock heads only: nothing is added to the model.
    logits [B, T, V], input_ids [B, T], patch_targets [B, P, K] -> scalar.
    """
    batch, patches, _ = patch_targets.shape
    image_logits = logits[input_ids == image_token_id].view(batch, patches, -1)  # [B, P, V]
    word_logits = image_logits.index_select(-1, word_ids).float()  # [B, P, K]
    return torch.nn.functional.binary_cross_entropy_with_logits(word_logits, patch_targets)


@torch.no_grad()
def revive_projector(model, pixel_values: torch.Tensor, seed: int, alive_share: float = 0.01,
                     scale: float = 2.0) -> int:
    """Re-initialise the projector's dead GELU units without changing the model's function.

    The CLIP residual stream that feeds the projector grows to norms of a few hundred, so the
    first projector layer's pre-activations are large and most hidden units end up negative on
    every patch (dead): the projector then passes little beyond a couple of dominant directions,
    and object colour / shape barely reach the language model. A unit positive on fewer than
    ``alive_share`` of the patches of ``pixel_values`` gets a fresh random input row scaled so
    its pre-activation has standard deviation ``scale`` and mean 0 on those patches, and a zero
    output column (so the model's outputs are unchanged). Returns the number of units revived.
    """
    projector = model.model.multi_modal_projector
    hidden_states = model.model.vision_tower(pixel_values, output_hidden_states=True).hidden_states
    h = hidden_states[model.config.vision_feature_layer][:, 1:].reshape(-1, projector.linear_1.in_features)  # [N, D]
    pre = projector.linear_1(h)  # [N, H]
    dead = (pre > 0).float().mean(0) < alive_share  # [H]
    n = int(dead.sum())
    if n == 0:
        return 0
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, h.shape[1], generator=gen)  # [n, D]
    centred = h - h.mean(0)
    std = (centred @ rows.T).std(0)  # [n]
    rows = rows * (scale / std)[:, None]
    projector.linear_1.weight[dead] = rows
    projector.linear_1.bias[dead] = -(h.mean(0) @ rows.T)
    projector.linear_2.weight[:, dead] = 0.0
    return n


def save_checkpoint(model, processor, out_dir: Path, log: TrainLog) -> None:
    """Save the HF checkpoint, the training log and the loss curve."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    (out_dir / "train_log.json").write_text(json.dumps(asdict(log), indent=1))
    plot_losses(log, out_dir / "loss_curve.png")


def plot_losses(log: TrainLog, path: Path) -> None:
    """Loss curve (raw and smoothed) with quick-eval caption accuracy on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    losses = np.asarray(log.losses)
    if len(losses):
        ax.plot(losses, alpha=0.3, lw=0.6, label="loss (answer tokens)")
        window = min(50, len(losses))
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(np.arange(window - 1, len(losses)), smooth, lw=1.5, label=f"mean of {window}")
    if log.patch_losses:
        patch = np.asarray(log.patch_losses)
        window = min(50, len(patch))
        ax.plot(np.arange(window - 1, len(patch)), np.convolve(patch, np.ones(window) / window, mode="valid"),
                lw=1.0, label="auxiliary patch loss (mean)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title("reference VLM (LLaVA) training")
    if log.evals:
        ax2 = ax.twinx()
        ax2.plot([e["step"] for e in log.evals], [e["accuracy"] for e in log.evals], "o-", color="C3", label="caption acc.")
        ax2.set_ylim(0, 1.02)
        ax2.set_ylabel("held-out greedy caption accuracy")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _start_model(settings: TrainSettings, sizes: VLMSizes) -> tuple[LlavaForConditionalGeneration, LlavaProcessor, TrainLog]:
    """The model, processor and log a run starts from: ``settings.init_from`` (continued, its
    patches refined with ``settings.refine_patches``) or a fresh build; then the dense
    vocabulary, the longer positions and the revived projector units that ``settings`` ask for."""
    settings_record = {k: str(v) for k, v in asdict(settings).items()}
    if settings.init_from is not None:
        model = LlavaForConditionalGeneration.from_pretrained(str(settings.init_from))
        processor = LlavaProcessor.from_pretrained(str(settings.init_from))
        log = TrainLog(**json.loads((Path(settings.init_from) / "train_log.json").read_text()))
        if not log.phases:
            log.phases = [log.settings]
        log.phases.append(settings_record)
        log.settings = settings_record
        log.stopped_early = False
        logger.info("continuing from %s (%d steps done) at global step %d", settings.init_from, log.steps_done,
                    settings.first_step)
        if settings.refine_patches:
            from raydec.reference.llava.refine import refine_patches

            model, processor = refine_patches(model, processor, settings.refine_patches,
                                              max(512, settings.max_positions))
            logger.info("refined image patches by %d: %d image tokens per image", settings.refine_patches,
                        model.config.image_seq_length)
    else:
        if settings.refine_patches:
            raise ValueError("refine_patches needs init_from (a trained model to refine)")
        processor = build_processor(vocabulary(), sizes)
        model = build_model(processor, sizes, settings.seed)
        log = TrainLog(settings=settings_record, sizes=asdict(sizes), phases=[settings_record])
    if settings.dense_share > 0:
        model, processor = extend_vocabulary(model, processor, dense_vocabulary())
    text_config = model.config.text_config
    text_config.max_position_embeddings = max(text_config.max_position_embeddings, settings.max_positions)
    if settings.revive_projector:
        probe = training_batch(settings.first_step, settings.batch_size, processor, settings.question_share)
        revived = revive_projector(model, probe["pixel_values"], settings.seed)
        logger.info("revived %d dead projector units", revived)
    return model, processor, log


def _attach_projector_probe(model, optimizer: torch.optim.Optimizer, settings: TrainSettings,
                           projected: list[torch.Tensor]) -> tuple[torch.nn.Linear | None, Any]:
    """With ``settings.projector_probe_weight`` > 0: the training-only linear probe (its
    parameters join ``optimizer``) and a forward hook that appends the projector's output to
    ``projected``; ``(None, None)`` otherwise."""
    if settings.projector_probe_weight <= 0:
        return None, None
    probe = torch.nn.Linear(model.config.text_config.hidden_size, len(PATCH_WORDS))
    torch.nn.init.normal_(probe.weight, std=0.02, generator=torch.Generator().manual_seed(settings.seed + 1))
    torch.nn.init.zeros_(probe.bias)
    optimizer.add_param_group({"params": list(probe.parameters()), "weight_decay": 0.0, "lr_mult": 1.0})
    hook = model.model.multi_modal_projector.register_forward_hook(lambda _m, _i, out: projected.append(out))
    return probe, hook


def _step_losses(model, batch: dict, settings: TrainSettings, word_ids: torch.Tensor, probe: torch.nn.Linear | None,
                projected: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One forward of ``batch`` (its ``patch_targets`` popped): (objective, answer loss, patch loss, probe loss or None)."""
    patch_targets = batch.pop("patch_targets")
    projected.clear()
    probe_loss = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
        out = model(**batch)
        loss = out.loss
        aux = patch_loss(out.logits, batch["input_ids"], model.config.image_token_id, word_ids, patch_targets)
        objective = loss + settings.patch_loss_weight * aux
        if settings.projector_probe_weight > 0:  # projected: [B, P, H], one image per sample
            probe_logits = probe(projected[-1].reshape(patch_targets.shape[0], patch_targets.shape[1], -1)).float()
            probe_loss = torch.nn.functional.binary_cross_entropy_with_logits(probe_logits, patch_targets)
            objective = objective + settings.projector_probe_weight * probe_loss
    return objective, loss, aux, probe_loss


def _evaluate_and_save(model, processor, settings: TrainSettings, log: TrainLog, step: int, elapsed: float) -> bool:
    """After ``step``: evaluate and checkpoint when due (every ``eval_every`` steps, the last step,
    out of time or at ``stop_after``); True when the run stops early here."""
    from raydec.reference.llava.evaluate import evaluate_captions

    last = step + 1 == settings.steps
    out_of_time = settings.max_minutes > 0 and elapsed > settings.max_minutes * 60
    out_of_time = out_of_time or (settings.stop_after > 0 and step + 1 >= settings.stop_after)
    if (step + 1) % settings.eval_every == 0 or last or out_of_time:
        if settings.eval_n > 0:
            result = evaluate_captions(model, processor, n=settings.eval_n, batch_size=settings.eval_n, progress=False)
            log.evals.append({"step": log.steps_done, "accuracy": result.accuracy, "example": result.captions[0]})
            logger.info("step %d: loss %.4f, quick caption accuracy %.3f; e.g. %r", log.steps_done,
                        float(np.mean(log.losses[-50:])), result.accuracy, result.captions[0])
        save_checkpoint(model, processor, settings.out_dir, log)
    if out_of_time and not last:
        log.stopped_early = True
        logger.warning("stopping early after %.1f min at step %d", elapsed / 60, log.steps_done)
        save_checkpoint(model, processor, settings.out_dir, log)
        return True
    return False


def run_training(settings: TrainSettings, sizes: VLMSizes) -> Path:
    """Train from scratch (or continue from ``settings.init_from``); returns the output folder."""
    torch.set_num_threads(settings.threads)
    random.seed(settings.seed)
    np.random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)

    model, processor, log = _start_model(settings, sizes)
    model.train()
    optimizer = make_optimizer(model, settings)
    log.parameters = sum(p.numel() for p in model.parameters())
    logger.info("reference VLM: %.2fM parameters, %d steps of %d", log.parameters / 1e6, settings.steps, settings.batch_size)
    steps_before, tokens_before, seconds_before = log.steps_done, log.tokens_seen, log.wall_seconds

    word_ids = torch.tensor(processor.tokenizer.convert_tokens_to_ids(list(PATCH_WORDS)))
    projected: list[torch.Tensor] = []  # the projector's output of the current forward
    probe, hook = _attach_projector_probe(model, optimizer, settings, projected)
    start = time.perf_counter()
    bar = tqdm(range(settings.steps), desc="vlm train")
    for step in bar:
        batch = training_batch(settings.first_step + step, settings.batch_size, processor, settings.question_share,
                               settings.focus_questions, settings.dense_share)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings) * group["lr_mult"]
        objective, loss, aux, probe_loss = _step_losses(model, batch, settings, word_ids, probe, projected)
        optimizer.zero_grad(set_to_none=True)
        objective.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        log.losses.append(float(loss.detach()))
        log.patch_losses.append(float(aux.detach()))
        log.tokens_seen += int(batch["attention_mask"].sum())
        log.steps_done = steps_before + step + 1
        elapsed = time.perf_counter() - start
        log.wall_seconds = seconds_before + elapsed
        tokens_per_second = (log.tokens_seen - tokens_before) / elapsed
        shown = {"loss": f"{log.losses[-1]:.3f}", "patch": f"{log.patch_losses[-1]:.3f}", "tok_s": f"{tokens_per_second:.0f}"}
        if probe_loss is not None:
            shown["probe"] = f"{float(probe_loss.detach()):.3f}"
        bar.set_postfix(**shown)
        if _evaluate_and_save(model, processor, settings, log, step, elapsed):
            break
    if hook is not None:
        hook.remove()
    logger.info("done: %d steps in %.1f min, %d tokens", log.steps_done, log.wall_seconds / 60, log.tokens_seen)
    return settings.out_dir
