"""Building the LLaVA assistant from the target and distilling it on the target's answers.

``build_assistant`` (:mod:`raydec.reference.assistant.build`) copies the target with fewer
language-model layers; ``distill`` trains it
by teacher forcing on ``prompt + target answer`` (cross-entropy on the answer tokens plus
``kl_weight`` x KL(target || assistant), answer positions only; AdamW, warm-up + cosine,
seeded data order, resumable state), checks held-out agreement at every checkpoint, then
tunes and measures HF assisted generation and ships the folder with its log, curve and card.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.assistant.build import build_assistant, file_sha256
from raydec.reference.assistant.card import write_model_card
from raydec.reference.assistant.data import build_caption_set, load_or_build_captions
from raydec.reference.assistant.measure import measure_assisted, tune_assisted_config
from raydec.reference.assistant.settings import AssistantSettings, DistillLog
from raydec.reference.shapes import HELD_OUT_SEED_START

logger = logging.getLogger(__name__)


def collate(rows: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded teacher-forcing batch and the target's logits at the answer positions.

    ``predict[b, t]`` marks positions whose next token is an answer token; ``next_ids`` holds that
    token (the target's answer: its greedy choice, or its sample) and ``teacher`` the target's logits there.
    """
    lengths = [len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows]
    batch, width = len(rows), max(lengths)
    vocab = rows[0]["logits"].shape[-1]
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((batch, width), dtype=torch.long)  # [B, T]
    predict = torch.zeros((batch, width), dtype=torch.bool)  # [B, T]
    next_ids = torch.zeros((batch, width), dtype=torch.long)  # [B, T]
    teacher = torch.zeros((batch, width, vocab), dtype=torch.float32)  # [B, T, V]
    for b, row in enumerate(rows):
        p, a = len(row["prompt_ids"]), len(row["answer_ids"])
        input_ids[b, :p] = row["prompt_ids"]
        input_ids[b, p:p + a] = row["answer_ids"]
        attention_mask[b, :p + a] = 1
        predict[b, p - 1:p - 1 + a] = True
        next_ids[b, p - 1:p - 1 + a] = row["answer_ids"]
        teacher[b, p - 1:p - 1 + a] = row["logits"].float()
    pixel_values = torch.stack([r["pixel_values"] for r in rows])  # [B, 3, H, W]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "pixel_values": pixel_values,
            "predict": predict, "next_ids": next_ids, "teacher": teacher}


def distill_loss(model, batch: dict[str, torch.Tensor], kl_weight: float,
                 image_input: str = "none") -> tuple[torch.Tensor, dict[str, float]]:
    """CE on the target's answer tokens + kl_weight * KL(target || assistant), answer positions only.

    ``image_input="none"`` feeds the prompt without ``pixel_values`` (the <image> positions keep the
    <image> token embedding), which is what HF assisted generation gives the assistant.
    """
    pixel_values = batch["pixel_values"] if image_input == "pixels" else None
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   pixel_values=pixel_values).logits  # [B, T, V]
    mask = batch["predict"]
    student = logits[mask].float()  # [M, V]
    targets = batch["next_ids"][mask]  # [M]
    teacher_logp = F.log_softmax(batch["teacher"][mask], dim=-1)  # [M, V]
    student_logp = F.log_softmax(student, dim=-1)
    ce = F.nll_loss(student_logp, targets)
    kl = F.kl_div(student_logp, teacher_logp, log_target=True, reduction="batchmean")
    loss = ce + kl_weight * kl
    agreement = (student.argmax(-1) == targets).float().mean()
    return loss, {"ce": float(ce.detach()), "kl": float(kl.detach()), "agreement": float(agreement)}


@torch.no_grad()
def heldout_agreement(model, rows: Sequence[dict[str, Any]], pad_id: int, image_input: str = "none") -> dict[str, float]:
    """Argmax agreement and CE of ``model`` on held-out target greedy captions (eval mode)."""
    was_training = model.training
    model.eval()
    _, stats = distill_loss(model, collate(rows, pad_id), kl_weight=1.0, image_input=image_input)
    model.train(was_training)
    return {"agreement": stats["agreement"], "ce": stats["ce"], "kl": stats["kl"]}


def learning_rate(step: int, settings: AssistantSettings, time_fraction: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``.

    ``time_fraction`` (elapsed / time cap, with ``anneal_on_time``) moves the cosine on when the
    run is slower than ``steps`` needs, so a time-capped run still ends annealed.
    """
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = min(1.0, max((step - settings.warmup) / max(1, settings.steps - settings.warmup), time_fraction))
    return settings.lr * (settings.min_lr_ratio + (1 - settings.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_indices(step: int, settings: AssistantSettings, n: int) -> list[int]:
    """Row indices of optimizer step ``step``: epochs of seeded permutations (resumable, deterministic)."""
    per_epoch = max(1, n // settings.batch_size)
    epoch, within = divmod(step, per_epoch)
    generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=generator)
    return order[within * settings.batch_size:(within + 1) * settings.batch_size].tolist()


def make_optimizer(model, settings: AssistantSettings) -> torch.optim.Optimizer:
    """AdamW over the trainable weights; no weight decay on norms, biases and embeddings."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 or "embed" in name or "norm" in name else decay).append(param)
    return torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=settings.lr, betas=(0.9, 0.95))


def plot_losses(log: DistillLog, path: Path) -> None:
    """Loss curve (total, CE, KL; raw and smoothed) with held-out argmax agreement on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for values, label in ((log.losses, "CE + KL"), (log.ce, "CE (greedy tokens)"), (log.kl, "KL(target || assistant)")):
        series = np.asarray(values)
        if len(series) == 0:
            continue
        window = min(25, len(series))
        smooth = np.convolve(series, np.ones(window) / window, mode="valid")
        line, = ax.plot(np.arange(window - 1, len(series)), smooth, lw=1.5, label=label)
        ax.plot(series, alpha=0.25, lw=0.6, color=line.get_color())
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (answer tokens)")
    ax.set_title("LLaVA assistant distillation")
    if log.heldout:
        ax2 = ax.twinx()
        ax2.plot([h["step"] for h in log.heldout], [h["agreement"] for h in log.heldout], "o-", color="C3",
                 label="held-out argmax agreement")
        ax2.set_ylim(0, 1.02)
        ax2.set_ylabel("held-out argmax agreement with target")
        ax2.legend(loc="lower left")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def save_assistant(model, processor, out_dir: Path, log: DistillLog | None = None) -> None:
    """The ``from_pretrained`` folder (weights, config, generation config, processor) + log + curve."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    if log is not None:
        compact = asdict(log)
        (out_dir / "train_log.json").write_text(json.dumps(compact, separators=(",", ":")))
        plot_losses(log, out_dir / "loss_curve.png")


def _new_log(settings: AssistantSettings, model, rows: Sequence[dict[str, Any]], caption_seconds: float,
             target_hash: str) -> DistillLog:
    """The log of a fresh run: settings, parameter counts and what the caption set holds."""
    log = DistillLog(settings={k: str(v) for k, v in asdict(settings).items()})
    log.parameters = sum(p.numel() for p in model.parameters())
    log.trainable_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.target_sha256 = target_hash
    log.captions = len(rows)
    log.caption_questions = sum(1 for r in rows if r["question"])
    log.caption_sampled = sum(1 for r in rows if r.get("temperature", 0.0) > 0)
    log.caption_tokens = int(sum(r["answer_ids"].numel() for r in rows))
    log.caption_seconds = caption_seconds
    return log


def _train_step(model, optimizer, trainable: list, rows: Sequence[dict[str, Any]], pad_id: int, step: int,
                settings: AssistantSettings, log: DistillLog, start: float, seconds_before: float) -> float:
    """One optimizer step on the seeded batch of ``step``, recorded in ``log``; returns its learning rate.

    ``start`` (``time.perf_counter()``) and ``seconds_before`` time the run for ``anneal_on_time``."""
    batch = collate([rows[i] for i in batch_indices(step, settings, len(rows))], pad_id)
    time_fraction = 0.0
    if settings.anneal_on_time and settings.max_minutes > 0:
        time_fraction = (seconds_before + time.perf_counter() - start) / (settings.max_minutes * 60)
    lr = learning_rate(step, settings, time_fraction)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss, stats = distill_loss(model, batch, settings.kl_weight, settings.image_input)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, settings.grad_clip)
    optimizer.step()
    log.losses.append(float(loss.detach()))
    log.ce.append(stats["ce"])
    log.kl.append(stats["kl"])
    log.agreement.append(stats["agreement"])
    log.steps_done = step + 1
    return lr


def _checkpoint(model, processor, optimizer, heldout: Sequence[dict[str, Any]], pad_id: int, step: int,
                settings: AssistantSettings, log: DistillLog, out_dir: Path, state_path: Path, stopped_early: bool) -> None:
    """Held-out agreement, then the shipped folder and the resumable state, after ``step``."""
    if heldout:
        log.heldout.append({"step": step + 1, **heldout_agreement(model, heldout, pad_id, settings.image_input)})
        logger.info("step %d: held-out agreement %.3f (ce %.4f)", step + 1, log.heldout[-1]["agreement"],
                    log.heldout[-1]["ce"])
    log.stopped_early = stopped_early
    save_assistant(model, processor, out_dir, log)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "log": asdict(log)}, state_path)


def distill(settings: AssistantSettings) -> Path:
    """Build the assistant from the target, distill it on the target's answers, measure, ship."""
    torch.set_num_threads(settings.threads)
    random.seed(settings.seed)
    np.random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    work_dir, out_dir = Path(settings.work_dir), Path(settings.out_dir)
    work_dir.mkdir(parents=True, exist_ok=True)

    target = LlavaForConditionalGeneration.from_pretrained(str(settings.target)).eval()
    processor = LlavaProcessor.from_pretrained(str(settings.target))
    target_hash = file_sha256(Path(settings.target) / "model.safetensors")
    pad_id = processor.tokenizer.pad_token_id
    logger.info("target %s (sha256 %s…)", settings.target, target_hash[:12])

    rows, caption_seconds = load_or_build_captions(settings, target, processor, target_hash)
    heldout_seeds = range(HELD_OUT_SEED_START + 10_000, HELD_OUT_SEED_START + 10_000 + settings.heldout_n)
    heldout = build_caption_set(target, processor, heldout_seeds, 0.0, max(1, settings.heldout_n), settings.max_new_tokens,
                                label="held-out captions") if settings.heldout_n else []

    model = build_assistant(target, settings.layers)
    for param in model.model.vision_tower.parameters():
        param.requires_grad_(False)
    model.train()
    optimizer = make_optimizer(model, settings)
    log = _new_log(settings, model, rows, caption_seconds, target_hash)
    first_step, seconds_before = 0, 0.0
    state_path = work_dir / "state.pt"
    if settings.resume and state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        log = DistillLog(**state["log"])
        first_step, seconds_before = log.steps_done, log.wall_seconds
        logger.info("resuming at step %d", first_step)
    if heldout and not log.heldout:
        log.heldout.append({"step": 0, **heldout_agreement(model, heldout, pad_id, settings.image_input)})
        logger.info("step 0 (target layers %s copied): held-out agreement %.3f", list(settings.layers),
                    log.heldout[-1]["agreement"])
    logger.info("assistant: %.2fM parameters (%.2fM trained), %d caption rows (%d answer tokens), %d steps of %d",
                log.parameters / 1e6, log.trainable_parameters / 1e6, len(rows), log.caption_tokens, settings.steps,
                settings.batch_size)
    trainable = [p for p in model.parameters() if p.requires_grad]
    start = time.perf_counter()
    for step in range(first_step, settings.steps):
        lr = _train_step(model, optimizer, trainable, rows, pad_id, step, settings, log, start, seconds_before)
        elapsed = time.perf_counter() - start
        log.wall_seconds = seconds_before + elapsed
        if (step + 1) % settings.log_every == 0 or step == first_step:
            recent = slice(-settings.log_every, None)
            logger.info("step %d/%d: loss %.4f (ce %.4f, kl %.4f), agreement %.3f, lr %.2e, %.2f s/step",
                        step + 1, settings.steps, np.mean(log.losses[recent]), np.mean(log.ce[recent]),
                        np.mean(log.kl[recent]), np.mean(log.agreement[recent]), lr,
                        elapsed / (step + 1 - first_step))
        last = step + 1 == settings.steps
        out_of_time = settings.max_minutes > 0 and log.wall_seconds > settings.max_minutes * 60
        if (step + 1) % settings.checkpoint_every == 0 or last or out_of_time:
            _checkpoint(model, processor, optimizer, heldout, pad_id, step, settings, log, out_dir, state_path,
                        out_of_time and not last)
        if out_of_time and not last:
            logger.warning("stopping after %.1f min of training at step %d", log.wall_seconds / 60, step + 1)
            break
    logger.info("distilled: %d steps in %.1f min", log.steps_done, log.wall_seconds / 60)
    del rows
    model.eval()
    if settings.tune_n > 0:
        log.tuning = tune_assisted_config(target, model, processor, n=settings.tune_n,
                                          max_new_tokens=settings.max_new_tokens)
    if settings.eval_n > 0:
        log.measurement = measure_assisted(target, model, processor, n=settings.eval_n,
                                           max_new_tokens=settings.max_new_tokens)
    save_assistant(model, processor, out_dir, log)
    write_model_card(out_dir, log)
    return out_dir
