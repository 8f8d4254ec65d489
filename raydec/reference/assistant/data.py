"""The LLaVA assistant's training data: the target's answers on held-in shapes-world images.

Each data seed gets the describe instruction or (a seeded share) one question; the target
answers it greedily (HF ``generate``, logits recorded) or, at a sampled temperature, by
raydec's AR decoder from a generator seeded by the image's seed, with its logits from one
teacher-forced forward. Rows are made in batches of one kind and one temperature, interleaved
so a time cap keeps every group's share, and cached per target hash and data settings.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import LlavaForConditionalGeneration, LlavaProcessor

from raydec.reference.assistant.settings import AssistantSettings
from raydec.reference.llava.model import DESCRIBE_INSTRUCTION, prompt_text
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, question_answers

logger = logging.getLogger(__name__)


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
