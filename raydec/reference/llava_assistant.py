"""A small LLaVA *assistant* for the reference VLM, for Hugging Face's own assisted generation.

``target.generate(**inputs, assistant_model=assistant)`` needs an assistant that shares the
target's tokenizer and processor. This module builds one from the shipped reference LLaVA
(``raydec/reference/weights/vlm``), distills it on the target's own answers (greedy, and with
``temperatures`` also sampled) and ships
it as a stock ``LlavaForConditionalGeneration`` folder with its processor and a model card:

- **build**: the target's config with ``num_hidden_layers`` = len(layers); the vision tower, the
  projector, the token embeddings, the final norm and the lm_head are copied from the target,
  and assistant layer ``i`` from target layer ``layers[i]`` (default: the first and the last).
- **captions**: the target answers held-in shapes-world images (seeds from ``first_seed``, all
  below :data:`~raydec.reference.shapes.HELD_OUT_SEED_START`), in batches: ``describe the
  image .`` or (a seeded share) one question of
  :func:`~raydec.reference.shapes.question_answers`. Each seed's answer is drawn at its
  ``temperature_of(seed)`` (``temperatures`` cycled over the seeds, default greedy only): greedy
  answers by HF ``generate``, sampled ones by raydec's AR decoder with a generator seeded by the
  image's seed (as the drafts' data), then one teacher-forced target forward for their logits.
  The answer tokens and the target's logits at every answer position are cached
  (``work_dir/captions-<target hash>.pt``).
- **distill**: teacher forcing on ``prompt + target answer``; loss on the answer positions only:
  cross-entropy on the target's answer tokens + ``kl_weight`` x KL(target || assistant) of the
  full next-token distributions. The vision tower stays frozen (it is the target's); the
  projector, embeddings, layers, norm and lm_head train. AdamW, warm-up + cosine.
- **measure**: on held-out images, batch 1, greedy: HF ``generate(assistant_model=...)`` vs plain
  ``generate``: identical outputs, wall-time ratio, target forwards (a forward hook) per token.

Everything is a pure function of the settings (data seeds, init, data order), except the time
cap. Entry point: ``python -m raydec.reference.train assistant [flags]``; re-measure a shipped
assistant with ``python -m raydec.reference.llava_assistant measure [--n 50]``.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.llava_vlm import DEFAULT_WEIGHTS_DIR, DESCRIBE_INSTRUCTION, prompt_text
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, question_answers

logger = logging.getLogger(__name__)

DEFAULT_ASSISTANT_DIR = Path(__file__).parent / "weights" / "vlm-drafts" / "assistant"
DEFAULT_WORK_DIR = Path("/tmp/raydec-assistant")


@dataclass
class AssistantSettings:
    """Knobs of one build + distill run."""

    target: Path = DEFAULT_WEIGHTS_DIR
    out_dir: Path = DEFAULT_ASSISTANT_DIR
    work_dir: Path = DEFAULT_WORK_DIR  # caption cache and resumable state (not shipped)
    layers: tuple[int, ...] = (0, 7)  # target layers copied into the assistant, in order; -1 = last
    seed: int = 0
    # data: the target's greedy answers on held-in seeds first_seed .. first_seed + num_captions - 1
    num_captions: int = 2048
    first_seed: int = 200_000
    question_share: float = 0.2
    # answer temperatures cycled over the seeds (first_seed + i answers at temperatures[i % n]); 0 is greedy.
    # An assistant for T=1 sampling should see sampled answers too: (0.0, 1.0).
    temperatures: tuple[float, ...] = (0.0,)
    caption_batch_size: int = 64
    max_new_tokens: int = 96
    caption_max_minutes: float = 0.0  # cap on caption generation (0: off; a cap makes the data size time-dependent)
    # optimisation
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    kl_weight: float = 1.0
    # "none": the assistant is trained on the prompt with its 64 <image> tokens but without pixel_values, because
    # HF assisted generation (transformers 5.24) never passes pixel_values to the assistant (its prefill runs with
    # is_first_iteration=False, which drops multimodal inputs); "pixels": image-conditioned training.
    image_input: str = "none"
    max_minutes: float = 0.0  # cap on training wall time (0: off)
    anneal_on_time: bool = False  # schedule progress = max(step / steps, time / max_minutes): decays fully at the cap
    threads: int = 1
    log_every: int = 20
    checkpoint_every: int = 200
    heldout_n: int = 16  # held-out greedy captions for the agreement check at every checkpoint
    eval_n: int = 50  # held-out images of the final assisted-generation measurement (0: skip)
    tune_n: int = 8  # held-in images to pick the draft length / confidence threshold on (0: keep HF defaults)
    resume: bool = False
    command: str = ""

    def __post_init__(self) -> None:
        from raydec.train.config import check_temperatures

        self.temperatures = tuple(float(t) for t in check_temperatures(self.temperatures))

    def temperature_of(self, seed: int) -> float:
        """The sampling temperature of the answer to data seed ``seed``."""
        return self.temperatures[(seed - self.first_seed) % len(self.temperatures)]


@dataclass
class DistillLog:
    """What the run did; saved as ``train_log.json`` next to the weights."""

    settings: dict
    parameters: int = 0
    trainable_parameters: int = 0
    target_sha256: str = ""
    captions: int = 0
    caption_questions: int = 0
    caption_sampled: int = 0  # rows answered at a temperature > 0
    caption_tokens: int = 0
    caption_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    ce: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    agreement: list[float] = field(default_factory=list)  # argmax(assistant) == target greedy token, per step
    heldout: list[dict] = field(default_factory=list)  # {"step", "agreement", "ce"} on held-out greedy captions
    steps_done: int = 0
    wall_seconds: float = 0.0
    stopped_early: bool = False
    tuning: dict = field(default_factory=dict)
    measurement: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- build


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file (identifies the target weights the captions came from)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build_assistant(target: LlavaForConditionalGeneration, layers: Sequence[int] = (0, -1)) -> LlavaForConditionalGeneration:
    """A ``len(layers)``-layer LLaVA initialised from ``target`` (same width, vision tower, projector, vocab).

    Assistant layer ``i`` is a copy of target layer ``layers[i]`` (negative: from the end);
    every other weight is copied as is. Returns a float32 model in train mode.
    """
    total = target.config.text_config.num_hidden_layers
    picked = [layer % total for layer in layers]
    if not picked or len(set(picked)) != len(picked):
        raise ValueError(f"layers must be distinct target layers, got {list(layers)} of {total}")
    config = copy.deepcopy(target.config)
    config.text_config.num_hidden_layers = len(picked)
    if getattr(config.text_config, "layer_types", None) is not None:
        config.text_config.layer_types = [config.text_config.layer_types[i] for i in picked]
    assistant = LlavaForConditionalGeneration(config)
    source = target.state_dict()
    prefix = "model.language_model.layers."
    state = {}
    for name in assistant.state_dict():
        if name.startswith(prefix):
            index, rest = name[len(prefix):].split(".", 1)
            state[name] = source[f"{prefix}{picked[int(index)]}.{rest}"]
        else:
            state[name] = source[name]
    assistant.load_state_dict(state, strict=True)
    assistant.generation_config = copy.deepcopy(target.generation_config)
    return assistant


# ------------------------------------------------------------------------------------------- captions


def example_prompt(seed: int, question_share: float) -> str:
    """The instruction of data seed ``seed``: the describe prompt or (a seeded share) one question."""
    rng = random.Random(seed * 104_729 + 11)
    if rng.random() < question_share:
        pairs = question_answers(make_sample(seed), rng)
        if pairs:
            return pairs[rng.randrange(len(pairs))][0]
    return DESCRIBE_INSTRUCTION


@torch.no_grad()
def target_answers(
    target: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    seeds: Sequence[int],
    instructions: Sequence[str],
    max_new_tokens: int,
) -> list[dict[str, Any]]:
    """One batched greedy HF ``generate`` of the target: per row prompt ids, answer ids (with eos) and logits."""
    images = [make_sample(seed).image for seed in seeds]
    inputs = processor(text=[prompt_text(q) for q in instructions], images=images, return_tensors="pt", padding=True)
    out = target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, output_logits=True,
                          return_dict_in_generate=True)
    width = inputs["input_ids"].shape[1]
    new = out.sequences[:, width:]  # [B, n]
    logits = torch.stack(out.logits, dim=1)  # [B, n, V]
    eos = target.generation_config.eos_token_id
    rows = []
    for i, seed in enumerate(seeds):
        prompt_ids = inputs["input_ids"][i][inputs["attention_mask"][i].bool()]
        answer = new[i].tolist()
        length = answer.index(eos) + 1 if eos in answer else len(answer)
        rows.append({
            "seed": int(seed),
            "question": instructions[i] != DESCRIBE_INSTRUCTION,
            "prompt_ids": prompt_ids.clone(),
            "answer_ids": torch.tensor(answer[:length], dtype=torch.long),
            "logits": logits[i, :length].to(torch.float16).clone(),
            "pixel_values": inputs["pixel_values"][i].clone(),
        })
    return rows


@torch.no_grad()
def teacher_logits(
    target: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    seeds: Sequence[int],
    instructions: Sequence[str],
    answers: Sequence[Sequence[int]],
) -> list[dict[str, Any]]:
    """Rows as :func:`target_answers` gives them, for given answers: one right-padded teacher-forced
    forward of ``prompt + answer``; the logits at position ``p - 1 + j`` predict answer token ``j``."""
    images = [make_sample(seed).image for seed in seeds]
    inputs = processor(text=[prompt_text(q) for q in instructions], images=images, return_tensors="pt", padding=True)
    prompts = [ids[mask.bool()] for ids, mask in zip(inputs["input_ids"], inputs["attention_mask"])]
    answers = [torch.tensor(list(a), dtype=torch.long) for a in answers]
    lengths = [len(p) + len(a) for p, a in zip(prompts, answers)]
    pad = processor.tokenizer.pad_token_id
    input_ids = torch.full((len(seeds), max(lengths)), pad, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros_like(input_ids)  # [B, T]
    for b, (prompt, answer) in enumerate(zip(prompts, answers)):
        input_ids[b, :lengths[b]] = torch.cat([prompt, answer])
        attention_mask[b, :lengths[b]] = 1
    logits = target(input_ids=input_ids, attention_mask=attention_mask, pixel_values=inputs["pixel_values"]).logits
    rows = []
    for b, seed in enumerate(seeds):
        p, a = len(prompts[b]), len(answers[b])
        rows.append({
            "seed": int(seed),
            "question": instructions[b] != DESCRIBE_INSTRUCTION,
            "prompt_ids": prompts[b].clone(),
            "answer_ids": answers[b],
            "logits": logits[b, p - 1:p - 1 + a].to(torch.float16).clone(),  # [a, V]
            "pixel_values": inputs["pixel_values"][b].clone(),
        })
    return rows


def sampled_answers(
    target: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    decoder: Any,
    seeds: Sequence[int],
    instructions: Sequence[str],
    max_new_tokens: int,
    temperature: float,
) -> list[dict[str, Any]]:
    """The target's answers sampled at ``temperature``, as rows of :func:`target_answers`.

    ``decoder`` is the same target loaded by :func:`raydec.api.load_target`; the answers follow
    the drafts' data rule (:func:`raydec.train.datagen.answers_at_temperatures`): each draws from a
    generator seeded by its image's seed, so it does not depend on its batch.
    """
    from raydec.reference.shapes import to_pil
    from raydec.train.datagen import answers_at_temperatures

    answers = answers_at_temperatures(decoder, [to_pil(make_sample(seed).image) for seed in seeds], instructions, seeds,
                                      lambda _: temperature, max_new_tokens, len(seeds))
    return teacher_logits(target, processor, seeds, instructions, [a.tokens for a in answers])


def caption_batches(
    jobs: Sequence[tuple[int, str, float]], batch_size: int, max_new_tokens: int
) -> list[tuple[list[tuple[int, str, float]], int, float]]:
    """``(seed, instruction, temperature)`` jobs -> ``(jobs, token limit, temperature)`` batches
    of one kind (descriptions or short answers) and one temperature each.

    Groups are interleaved in proportion to their sizes, so a time cap that stops after any
    batch has made about the same share of every group (not all greedy rows and no sampled ones).
    """
    groups = []
    for temperature in sorted({t for _, _, t in jobs}):
        for describe in (True, False):
            group = [j for j in jobs if j[2] == temperature and (j[1] == DESCRIBE_INSTRUCTION) == describe]
            limit = max_new_tokens if describe else 8
            groups.append([(group[i:i + batch_size], limit, temperature) for i in range(0, len(group), batch_size)])
    # batch i of a group of n sits at (i + 1/2) / n of the way through; ties keep group order
    placed = [((i + 0.5) / len(g), order, b) for order, g in enumerate(groups) for i, b in enumerate(g)]
    return [b for _, _, b in sorted(placed, key=lambda x: (x[0], x[1]))]


def build_caption_set(
    target: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    seeds: Sequence[int],
    question_share: float,
    batch_size: int,
    max_new_tokens: int,
    max_minutes: float = 0.0,
    label: str = "captions",
    temperature_of: Any = None,
    decoder: Any = None,
) -> list[dict[str, Any]]:
    """The target's answers for ``seeds`` (greedy, or at ``temperature_of(seed)``: see
    :func:`sampled_answers`, which needs ``decoder``); batched by kind and temperature."""
    target.eval()
    temperature_of = temperature_of or (lambda seed: 0.0)
    jobs = [(seed, example_prompt(seed, question_share), temperature_of(seed)) for seed in seeds]
    if decoder is None and any(t > 0 for _, _, t in jobs):
        bad = max(t for _, _, t in jobs)
        raise ValueError(f"temperature {bad}: sampled answers need decoder= (the target from load_target)")
    batches = caption_batches(jobs, batch_size, max_new_tokens)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for number, (batch, limit, temperature) in enumerate(batches):
        batch_seeds, instructions = [s for s, _, _ in batch], [q for _, q, _ in batch]
        if temperature == 0:
            made = target_answers(target, processor, batch_seeds, instructions, limit)
        else:
            made = sampled_answers(target, processor, decoder, batch_seeds, instructions, limit, temperature)
        rows += [{**row, "temperature": temperature} for row in made]
        elapsed = time.perf_counter() - start
        if (number + 1) % 5 == 0 or number + 1 == len(batches):
            logger.info("%s: %d/%d batches, %d rows, %.0f s (%.1f rows/s)", label, number + 1, len(batches),
                        len(rows), elapsed, len(rows) / max(elapsed, 1e-9))
        if max_minutes > 0 and elapsed > max_minutes * 60 and number + 1 < len(batches):
            logger.warning("%s: stopping after %.1f min with %d rows (cap)", label, elapsed / 60, len(rows))
            break
    rows.sort(key=lambda r: r["seed"])
    return rows


def load_or_build_captions(settings: AssistantSettings, target, processor, target_hash: str) -> tuple[list, float]:
    """The cached caption set of this target and data settings, generating it when missing."""
    key = f"{target_hash[:16]}-{settings.first_seed}-{settings.num_captions}-{settings.question_share}-{settings.max_new_tokens}"
    if settings.temperatures != (0.0,):  # greedy-only caches keep their old name
        key += "-t" + "_".join(f"{t:g}" for t in settings.temperatures)
    path = Path(settings.work_dir) / f"captions-{key}.pt"
    if path.is_file():
        blob = torch.load(path, weights_only=False)
        logger.info("caption cache %s: %d rows (made in %.0f s)", path, len(blob["rows"]), blob["seconds"])
        return blob["rows"], blob["seconds"]
    seeds = range(settings.first_seed, settings.first_seed + settings.num_captions)
    if seeds[-1] >= HELD_OUT_SEED_START:
        raise ValueError(f"training seeds reach {seeds[-1]} (held-out range starts at {HELD_OUT_SEED_START})")
    decoder = None
    if any(t > 0 for t in settings.temperatures):
        from raydec.api import load_target

        decoder = load_target(settings.target, task="caption")
    start = time.perf_counter()
    rows = build_caption_set(target, processor, seeds, settings.question_share, settings.caption_batch_size,
                             settings.max_new_tokens, settings.caption_max_minutes,
                             temperature_of=settings.temperature_of, decoder=decoder)
    seconds = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rows": rows, "seconds": seconds}, path)
    logger.info("caption cache written: %s (%d rows, %.0f s)", path, len(rows), seconds)
    return rows, seconds


# -------------------------------------------------------------------------------------------- distill


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
    log = DistillLog(settings={k: str(v) for k, v in asdict(settings).items()})
    log.parameters = sum(p.numel() for p in model.parameters())
    log.trainable_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.target_sha256 = target_hash
    log.captions = len(rows)
    log.caption_questions = sum(1 for r in rows if r["question"])
    log.caption_sampled = sum(1 for r in rows if r.get("temperature", 0.0) > 0)
    log.caption_tokens = int(sum(r["answer_ids"].numel() for r in rows))
    log.caption_seconds = caption_seconds
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
            if heldout:
                log.heldout.append({"step": step + 1, **heldout_agreement(model, heldout, pad_id, settings.image_input)})
                logger.info("step %d: held-out agreement %.3f (ce %.4f)", step + 1, log.heldout[-1]["agreement"],
                            log.heldout[-1]["ce"])
            log.stopped_early = out_of_time and not last
            save_assistant(model, processor, out_dir, log)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "log": asdict(log)}, state_path)
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


# -------------------------------------------------------------------------------------------- measure


class _ForwardCounter:
    """Counts ``forward`` calls of a module (a forward hook)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.count += 1

    def remove(self) -> None:
        self._handle.remove()


@torch.no_grad()
def measure_assisted(
    target: LlavaForConditionalGeneration,
    assistant: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    n: int = 50,
    first_seed: int = HELD_OUT_SEED_START,
    max_new_tokens: int = 96,
    repeats: int = 1,
) -> dict[str, Any]:
    """Batch 1, greedy, held-out images ``first_seed..``: HF assisted vs plain ``generate``.

    With ``repeats`` > 1 each image's plain / assisted pair runs that many times (interleaved) and
    each side keeps its fastest time, which filters out stalls from other jobs on a shared CPU.

    Per image: plain then assisted generation (timed, after one untimed warm-up of each), the
    outputs compared, forwards of the target and the assistant counted by forward hooks. The
    target runs once per verification round, so new tokens / target forwards is the tokens per
    round; each round adds exactly one target token, so accepted draft tokens = new tokens -
    rounds, and (one assistant forward per drafted token) acceptance = accepted / assistant
    forwards.
    """
    target.eval()
    assistant.eval()
    target_calls, assistant_calls = _ForwardCounter(target), _ForwardCounter(assistant)
    rows = []
    try:
        for index, seed in enumerate([first_seed] + list(range(first_seed, first_seed + n))):
            inputs = processor(text=[prompt_text()], images=[make_sample(seed).image], return_tensors="pt")
            width = inputs["input_ids"].shape[1]
            plain_s, assisted_s, identical = [], [], True
            for _ in range(max(1, repeats)):
                t0 = time.perf_counter()
                plain = target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
                t1 = time.perf_counter()
                target_calls.count = assistant_calls.count = 0
                t2 = time.perf_counter()
                assisted = target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                           assistant_model=assistant)
                t3 = time.perf_counter()
                plain_s.append(t1 - t0)
                assisted_s.append(t3 - t2)
                identical = identical and bool(torch.equal(plain, assisted))
            if index == 0:
                continue  # warm-up
            new_tokens = assisted.shape[1] - width
            rows.append({
                "seed": seed,
                "identical": identical,
                "plain_s": min(plain_s),
                "assisted_s": min(assisted_s),
                "new_tokens": int(new_tokens),
                "target_forwards": target_calls.count,
                "assistant_forwards": assistant_calls.count,
            })
    finally:
        target_calls.remove()
        assistant_calls.remove()
    ratios = [r["assisted_s"] / r["plain_s"] for r in rows]
    tokens = sum(r["new_tokens"] for r in rows)
    rounds = sum(r["target_forwards"] for r in rows)
    drafted = sum(r["assistant_forwards"] for r in rows)
    result = {
        "images": len(rows),
        "first_seed": first_seed,
        "max_new_tokens": max_new_tokens,
        "repeats": max(1, repeats),
        "num_assistant_tokens": assistant.generation_config.num_assistant_tokens or 20,
        "assistant_confidence_threshold": 0.4 if assistant.generation_config.assistant_confidence_threshold is None
        else assistant.generation_config.assistant_confidence_threshold,
        "identical": sum(r["identical"] for r in rows),
        "mean_time_ratio": float(np.mean(ratios)),
        "median_time_ratio": float(np.median(ratios)),
        "total_plain_s": float(sum(r["plain_s"] for r in rows)),
        "total_assisted_s": float(sum(r["assisted_s"] for r in rows)),
        "new_tokens": int(tokens),
        "target_forwards": int(rounds),
        "assistant_forwards": int(drafted),
        "tokens_per_target_forward": tokens / max(rounds, 1),
        "acceptance": (tokens - rounds) / max(drafted, 1),
        "per_image": rows,
    }
    logger.info("assisted vs plain on %d held-out images: %d identical, mean time ratio %.3f, %.2f tokens per "
                "target forward, acceptance %.3f", len(rows), result["identical"], result["mean_time_ratio"],
                result["tokens_per_target_forward"], result["acceptance"])
    return result


TUNING_GRID: tuple[tuple[int, float], ...] = ((20, 0.4), (20, 0.0), (10, 0.4), (10, 0.0), (6, 0.4), (6, 0.0), (4, 0.0))


@torch.no_grad()
def tune_assisted_config(
    target: LlavaForConditionalGeneration,
    assistant: LlavaForConditionalGeneration,
    processor: LlavaProcessor,
    n: int = 8,
    first_seed: int = 990_000,
    max_new_tokens: int = 96,
    grid: Sequence[tuple[int, float]] = TUNING_GRID,
) -> dict[str, Any]:
    """Pick ``num_assistant_tokens`` and ``assistant_confidence_threshold`` by wall time on held-in images.

    HF assisted generation reads both from the assistant's ``generation_config`` (defaults 20 and
    0.4). Each image is decoded with every grid entry in turn (so load drift hits all alike),
    batch 1, greedy; the fastest total is written into ``assistant.generation_config`` (and so
    ships with the weights). Seeds ``first_seed..`` are held-in (< 1,000,000), not the measured ones.
    """
    seconds = [0.0] * len(grid)
    for index, seed in enumerate([first_seed] + list(range(first_seed, first_seed + n))):
        inputs = processor(text=[prompt_text()], images=[make_sample(seed).image], return_tensors="pt")
        for k, (tokens, threshold) in enumerate(grid):
            assistant.generation_config.num_assistant_tokens = tokens
            assistant.generation_config.assistant_confidence_threshold = threshold
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            t0 = time.perf_counter()
            target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=assistant)
            if index > 0:  # the first image is a warm-up
                seconds[k] += time.perf_counter() - t0
    best = int(np.argmin(seconds))
    tokens, threshold = grid[best]
    assistant.generation_config.num_assistant_tokens = tokens
    assistant.generation_config.assistant_confidence_threshold = threshold
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    table = [{"num_assistant_tokens": t, "assistant_confidence_threshold": c, "seconds": s}
             for (t, c), s in zip(grid, seconds)]
    logger.info("assisted-generation settings on %d held-in images: %s -> num_assistant_tokens %d, threshold %.2f", n,
                ", ".join(f"({r['num_assistant_tokens']}, {r['assistant_confidence_threshold']}): {r['seconds']:.2f} s"
                          for r in table), tokens, threshold)
    return {"images": n, "first_seed": first_seed, "grid": table, "num_assistant_tokens": tokens,
            "assistant_confidence_threshold": threshold}


# ---------------------------------------------------------------------------------------------- card


def card_temperatures(settings: dict) -> tuple[float, ...]:
    """The answer temperatures of a run's logged settings (logs from before the field: greedy)."""
    raw = str(settings.get("temperatures", "(0.0,)")).strip("()[] ")
    return tuple(float(t) for t in raw.split(",") if t.strip()) or (0.0,)


def answers_kind(settings: dict) -> str:
    """'greedy outputs', or 'answers, greedy and sampled at T=1', for the card's first line."""
    sampled = [t for t in card_temperatures(settings) if t > 0]
    if not sampled:
        return "greedy outputs"
    return "answers, greedy and sampled at " + ", ".join(f"T={t:g}" for t in sampled)


def data_answers(settings: dict, log: dict) -> str:
    """How the card's data line says the answers were drawn."""
    temperatures = card_temperatures(settings)
    if temperatures == (0.0,):
        return "Greedy answers by HF `generate`, its logits recorded"
    cycle = ", ".join(f"{t:g}" for t in temperatures)
    sampled = log.get("caption_sampled", 0)
    return (f"Temperatures ({cycle}) cycled over the seeds (`--temperatures {cycle.replace(' ', '')}`): "
            f"{log['captions'] - sampled} answers greedy by HF `generate` (its logits recorded), {sampled} sampled by "
            "raydec's AR decoder from a generator seeded by the image's seed (the drafts' rule), their logits from one "
            "teacher-forced target forward")


def kept_section(card: Path, heading: str) -> list[str]:
    """The lines of an existing card's hand-written ``heading`` section (up to the next ``## ``), or []."""
    if not card.is_file():
        return []
    lines = card.read_text().splitlines()
    if heading not in lines:
        return []
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = lines[start:end]
    while section and not section[-1].strip():
        section.pop()
    return section


def write_model_card(out_dir: Path, log: DistillLog | dict) -> Path:
    """``MODEL_CARD.md`` of a shipped assistant from its log (figures, command, measurement); a
    hand-written ``## History`` section of the card it replaces is kept."""
    log = asdict(log) if isinstance(log, DistillLog) else log
    config = json.loads((out_dir / "config.json").read_text())
    settings = log["settings"]
    text = config["text_config"]
    size = sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file() and p.name != "MODEL_CARD.md")
    last = log["losses"][-100:]
    m = log.get("measurement") or {}
    lines = [
        "# LLaVA assistant for the reference VLM (HF assisted generation)",
        "",
        "A small `LlavaForConditionalGeneration` that shares the reference VLM's tokenizer, processor, vision tower",
        f"and vocabulary, distilled on the reference VLM's own {answers_kind(settings)}, for Hugging Face's assisted "
        "generation:",
        "",
        "```python",
        "from transformers import LlavaForConditionalGeneration, LlavaProcessor",
        'target = LlavaForConditionalGeneration.from_pretrained("raydec/reference/weights/vlm")',
        'assistant = LlavaForConditionalGeneration.from_pretrained("raydec/reference/weights/vlm-drafts/assistant")',
        'processor = LlavaProcessor.from_pretrained("raydec/reference/weights/vlm-drafts/assistant")',
        'inputs = processor(text=["USER: <image> describe the image . ASSISTANT:"], images=[image], return_tensors="pt")',
        "out = target.generate(**inputs, max_new_tokens=96, do_sample=False, assistant_model=assistant)",
        "```",
        "",
        "## Architecture",
        "",
        f"- Same as the target (`raydec/reference/weights/vlm`) except the language model: {text['num_hidden_layers']} "
        f"Llama layers (hidden {text['hidden_size']}, MLP {text['intermediate_size']}, {text['num_attention_heads']} heads) "
        f"instead of 8.",
        f"- Initialised from the target (sha256 `{log['target_sha256'][:16]}…` of its model.safetensors): vision tower, "
        f"projector, token embeddings, final norm and lm_head copied; assistant layers = target layers "
        f"{settings['layers']}.",
        f"- Parameters: {log['parameters'] / 1e6:.2f}M ({log['trainable_parameters'] / 1e6:.2f}M trained; the vision "
        f"tower stays the target's, frozen). Shipped folder {size / 2**20:.1f} MB.",
        "",
        "## Distillation",
        "",
        "```",
        settings.get("command") or "python -m raydec.reference.train assistant",
        "```",
        "",
        f"- Data: the target's answers to {log['captions']} held-in shapes-world images (seeds "
        f"{settings['first_seed']}..{int(settings['first_seed']) + int(settings['num_captions']) - 1}, < 1,000,000): "
        f"`describe the image .` or, for a seeded {float(settings['question_share']):.0%}, one question of "
        f"`shapes.question_answers`; batches of {settings['caption_batch_size']}, max {settings['max_new_tokens']} new "
        f"tokens; {log['caption_tokens']} answer tokens; generated in {log['caption_seconds'] / 60:.1f} min. "
        f"{data_answers(settings, log)}.",
        ("- Image input: **none** (`--image-input none`). HF assisted generation in transformers 5.24 never gives the "
         "assistant the image: `generate()` runs the assistant's prefill with `is_first_iteration=False` "
         "(`is_assistant`), which drops `pixel_values`, so the assistant sees the prompt with its 64 `<image>` token "
         "embeddings only (checked with a forward hook). The assistant is therefore trained exactly so: teacher "
         "forcing without `pixel_values`; it drafts from the prompt, the chat format and the caption so far. The copied "
         "vision tower and projector stay in the checkpoint (stock class, same processor) but HF does not run them."
         if settings.get("image_input", "none") == "none" else
         "- Image input: pixels (the assistant is trained with `pixel_values`; note that HF assisted generation in "
         "transformers 5.24 does not pass them to the assistant)."),
        f"- Loss (answer positions only, teacher forcing on prompt + target answer): cross-entropy on the target's answer "
        f"tokens + {settings['kl_weight']} x KL(target || assistant) of the full next-token distribution (the target's "
        f"logits: recorded during greedy generation, or from a teacher-forced forward on a sampled answer).",
        f"- AdamW (betas 0.9 / 0.95, weight decay {settings['weight_decay']} on matrices), peak lr {settings['lr']}, "
        f"{settings['warmup']} warm-up steps then cosine to {settings['min_lr_ratio']} x peak"
        f"{' (progress = max(step / steps, elapsed / time cap))' if settings.get('anneal_on_time') == 'True' else ''}, grad clip "
        f"{settings['grad_clip']}, batch {settings['batch_size']}, float32, seed {settings['seed']}, "
        f"`torch.set_num_threads({settings['threads']})`.",
        f"- Steps: {log['steps_done']} of {settings['steps']}{' (stopped at the time cap)' if log['stopped_early'] else ''}; "
        f"training wall time {log['wall_seconds'] / 60:.1f} min on one thread of a shared 2-core CPU (other jobs running).",
        f"- Final loss (mean of the last {len(last)} steps): {np.mean(last):.4f} (CE {np.mean(log['ce'][-100:]):.4f}, "
        f"KL {np.mean(log['kl'][-100:]):.4f}); first step {log['losses'][0]:.4f}. Training argmax agreement with the "
        f"target's answer token (last {len(last)} steps; a sampled token is often not the argmax): "
        f"{np.mean(log['agreement'][-100:]):.3f}.",
        "- Curve: `loss_curve.png`; per-step losses: `train_log.json`.",
    ]
    if log["heldout"]:
        lines += ["", "Held-out argmax agreement with the target's greedy token (teacher forcing on the target's greedy "
                  f"captions of {settings['heldout_n']} held-out images, seeds 1010000..):", "",
                  "| step | agreement | CE |", "|---:|---:|---:|"]
        lines += [f"| {h['step']} | {h['agreement']:.3f} | {h['ce']:.4f} |" for h in log["heldout"]]
    if m:
        lines += [
            "",
            "## Measured: HF assisted generation vs plain generation",
            "",
            f"{m['images']} held-out images (seeds {m['first_seed']}..{m['first_seed'] + m['images'] - 1}), prompt "
            f"`describe the image .`, greedy, batch 1, max {m['max_new_tokens']} new tokens, the assistant's shipped "
            f"generation config (up to {m['num_assistant_tokens']} draft tokens per round, assistant confidence threshold "
            f"{m['assistant_confidence_threshold']}), one untimed warm-up, plain then assisted per image, same CPU thread"
            + (f", each pair run {m['repeats']} times and each side's fastest time kept (the shared CPU stalls "
               "runs at random)" if m.get("repeats", 1) > 1 else "") + ":",
            "",
            f"- **Outputs identical: {m['identical']}/{m['images']}.**",
            f"- **Mean wall-time ratio assisted / plain: {m['mean_time_ratio']:.3f}** (median {m['median_time_ratio']:.3f}; "
            f"totals {m['total_assisted_s']:.1f} s vs {m['total_plain_s']:.1f} s).",
            f"- Target forwards (forward hook): {m['target_forwards']} for {m['new_tokens']} new tokens = "
            f"**{m['tokens_per_target_forward']:.2f} tokens per target forward** (plain greedy: 1.00).",
            f"- Assistant draft acceptance: (new tokens - verification rounds) / assistant forwards = "
            f"{m['new_tokens'] - m['target_forwards']} / {m['assistant_forwards']} = **{m['acceptance']:.3f}**.",
            "- Re-measure: `python -m raydec.reference.llava_assistant measure --n 50 --repeats 3 --write-card`.",
        ]
        for e in log.get("earlier_measurements") or []:
            lines.append(f"- Earlier measurement on the same images ({e.get('repeats', 1)} run(s) per pair, at the end of "
                         f"the distillation run): {e['identical']}/{e['images']} identical, mean time ratio "
                         f"{e['mean_time_ratio']:.3f} (median {e['median_time_ratio']:.3f}), "
                         f"{e['tokens_per_target_forward']:.2f} tokens per target forward, acceptance {e['acceptance']:.3f}.")
    tuning = log.get("tuning") or {}
    if tuning:
        lines += ["", f"Draft length and confidence threshold (read by HF from the assistant's `generation_config.json`) "
                  f"were picked by total assisted wall time on {tuning['images']} held-in images (seeds "
                  f"{tuning['first_seed']}..), not the measured ones; HF's defaults are 20 / 0.4:", "",
                  "| num_assistant_tokens | assistant_confidence_threshold | seconds |", "|---:|---:|---:|"]
        lines += [f"| {r['num_assistant_tokens']} | {r['assistant_confidence_threshold']} | {r['seconds']:.2f} |"
                  for r in tuning["grid"]]
    history = kept_section(out_dir / "MODEL_CARD.md", "## History")
    if history:
        lines += ["", *history]
    lines += [
        "",
        "## Limits",
        "",
        "- Only useful with this target (same tokenizer, processor and shapes world); retrain it when the target changes.",
        "- On this tiny target, one assistant forward costs a sizeable share of a target forward on CPU (the Python",
        "  overhead of each forward dominates), so wall-time gains are far below the tokens-per-forward figure.",
        "",
    ]
    path = out_dir / "MODEL_CARD.md"
    path.write_text("\n".join(lines))
    return path


# ------------------------------------------------------------------------------------------------ CLI


def add_assistant_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m raydec.reference.train assistant``."""
    from raydec.reference.draft_command import temperatures_arg

    d = AssistantSettings()
    parser.add_argument("--target", type=Path, default=d.target, help="the target LLaVA folder")
    parser.add_argument("--out", type=Path, default=d.out_dir, help="output folder (from_pretrained layout)")
    parser.add_argument("--work-dir", type=Path, default=d.work_dir, help="caption cache + resumable state (not shipped)")
    parser.add_argument("--layers", type=int, nargs="+", default=list(d.layers), help="target layers to copy (-1: last)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--num-captions", type=int, default=d.num_captions, help="held-in images the target answers")
    parser.add_argument("--first-seed", type=int, default=d.first_seed, help="first data seed (< 1,000,000)")
    parser.add_argument("--question-share", type=float, default=d.question_share)
    parser.add_argument("--temperatures", type=temperatures_arg, default=list(d.temperatures),
                        help="answer temperatures cycled over the seeds, e.g. 0,1 (default 0: greedy only)")
    parser.add_argument("--caption-batch-size", type=int, default=d.caption_batch_size)
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    parser.add_argument("--caption-max-minutes", type=float, default=d.caption_max_minutes)
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--warmup", type=int, default=d.warmup)
    parser.add_argument("--image-input", choices=("none", "pixels"), default=d.image_input,
                        help="none: train without pixel_values, as HF assisted generation runs the assistant")
    parser.add_argument("--kl-weight", type=float, default=d.kl_weight, help="weight of KL(target || assistant)")
    parser.add_argument("--max-minutes", type=float, default=d.max_minutes, help="training time cap (0: off)")
    parser.add_argument("--anneal-on-time", action="store_true",
                        help="cosine progress = max(step / steps, elapsed / max-minutes): ends annealed at the time cap")
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--log-every", type=int, default=d.log_every)
    parser.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    parser.add_argument("--heldout-n", type=int, default=d.heldout_n)
    parser.add_argument("--eval-n", type=int, default=d.eval_n, help="held-out images of the final measurement")
    parser.add_argument("--tune-n", type=int, default=d.tune_n,
                        help="held-in images to pick draft length / confidence threshold on (0: HF defaults)")
    parser.add_argument("--resume", action="store_true", help="continue from work-dir/state.pt")


def distill_from_args(args: argparse.Namespace) -> Path:
    """Build :class:`AssistantSettings` from parsed flags and distill."""
    command = "python -m raydec.reference.train assistant " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else [])
    settings = AssistantSettings(
        target=args.target, out_dir=args.out, work_dir=args.work_dir, layers=tuple(args.layers), seed=args.seed,
        num_captions=args.num_captions, first_seed=args.first_seed, question_share=args.question_share,
        temperatures=tuple(args.temperatures),
        caption_batch_size=args.caption_batch_size, max_new_tokens=args.max_new_tokens,
        caption_max_minutes=args.caption_max_minutes, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        warmup=args.warmup, kl_weight=args.kl_weight, image_input=args.image_input, max_minutes=args.max_minutes, anneal_on_time=args.anneal_on_time, threads=args.threads,
        log_every=args.log_every, checkpoint_every=args.checkpoint_every, heldout_n=args.heldout_n,
        eval_n=args.eval_n, tune_n=args.tune_n, resume=args.resume, command=command.strip(),
    )
    return distill(settings)


def main(argv: Sequence[str] | None = None) -> None:
    """``measure``: re-measure a saved assistant against the target and (optionally) rewrite its card."""
    parser = argparse.ArgumentParser(prog="python -m raydec.reference.llava_assistant")
    sub = parser.add_subparsers(dest="command", required=True)
    measure = sub.add_parser("measure", help="HF assisted vs plain generate on held-out images")
    measure.add_argument("--assistant", type=Path, default=DEFAULT_ASSISTANT_DIR)
    measure.add_argument("--target", type=Path, default=DEFAULT_WEIGHTS_DIR)
    measure.add_argument("--n", type=int, default=50)
    measure.add_argument("--max-new-tokens", type=int, default=96)
    measure.add_argument("--repeats", type=int, default=1, help="runs per image and side; the fastest is kept")
    measure.add_argument("--write-card", action="store_true", help="store the result in train_log.json and the card")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    target = LlavaForConditionalGeneration.from_pretrained(str(args.target)).eval()
    assistant = LlavaForConditionalGeneration.from_pretrained(str(args.assistant)).eval()
    processor = LlavaProcessor.from_pretrained(str(args.assistant))
    result = measure_assisted(target, assistant, processor, n=args.n, max_new_tokens=args.max_new_tokens,
                              repeats=args.repeats)
    summary = {k: v for k, v in result.items() if k != "per_image"}
    print(json.dumps(summary, indent=1))
    if args.write_card:
        log = json.loads((args.assistant / "train_log.json").read_text())
        if log.get("measurement"):
            earlier = {k: v for k, v in log["measurement"].items() if k != "per_image"}
            log.setdefault("earlier_measurements", []).append(earlier)
        log["measurement"] = result
        (args.assistant / "train_log.json").write_text(json.dumps(log, separators=(",", ":")))
        write_model_card(args.assistant, log)


if __name__ == "__main__":
    main()
