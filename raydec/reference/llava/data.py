"""Training batches for the reference VLM, drawn from the seeded shapes world.

Every training example is a pure function of its seed, so the data order is deterministic:
step ``s`` of a run with batch size ``B`` uses seeds ``s*B .. s*B+B-1`` (all below the
held-out range). A seeded share of the examples is a short question instead of a description.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
from transformers import LlavaProcessor

from raydec.reference.llava.model import DESCRIBE_INSTRUCTION, prompt_text
from raydec.reference.shapes.dense import DENSE_INSTRUCTION, dense_description
from raydec.reference.shapes import (
    BACKGROUND_COLORS,
    BACKGROUNDS,
    COLORS,
    FILLS,
    HELD_OUT_SEED_START,
    POSITIONS,
    SHAPES,
    SIZES,
    ShapesSample,
    make_sample,
    object_box,
    question_answers,
)

IGNORE_INDEX = -100
# Words a patch can be tagged with by the auxiliary patch loss (see ``patch_attribute_targets``).
PATCH_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys([*COLORS, *SHAPES, *SIZES, *FILLS, *BACKGROUNDS, *BACKGROUND_COLORS, *" ".join(POSITIONS).split()])
)


@dataclass(frozen=True)
class Example:
    """One (image, instruction, answer) triple."""

    image: np.ndarray  # [H, W, 3] uint8
    instruction: str
    answer: str
    patch_targets: np.ndarray  # [P, len(PATCH_WORDS)] multi-hot words of each image patch


def patch_attribute_targets(sample: ShapesSample, patch_size: int = 8) -> np.ndarray:
    """Multi-hot word tags of each image patch (row-major), for the auxiliary patch loss.

    A patch at least a quarter covered by an object's box is tagged with that object's colour,
    shape, size, fill and position words; any other patch with the background kind and colour.
    Returns ``[P, len(PATCH_WORDS)]`` float32 with ``P = (H / patch_size) ** 2``.
    """
    side = sample.image.shape[0]
    grid = side // patch_size
    index = {w: i for i, w in enumerate(PATCH_WORDS)}
    targets = np.zeros((grid * grid, len(PATCH_WORDS)), dtype=np.float32)
    best_cover = np.zeros(grid * grid, dtype=np.float32)
    owner = np.full(grid * grid, -1)
    for k, obj in enumerate(sample.objects):
        x0, y0, box = object_box(obj.position, obj.size, side)
        for p in range(grid * grid):
            py, px = divmod(p, grid)
            overlap_x = max(0, min(x0 + box, (px + 1) * patch_size) - max(x0, px * patch_size))
            overlap_y = max(0, min(y0 + box, (py + 1) * patch_size) - max(y0, py * patch_size))
            cover = overlap_x * overlap_y / patch_size**2
            if cover >= 0.25 and cover > best_cover[p]:
                best_cover[p], owner[p] = cover, k
    for p in range(grid * grid):
        if owner[p] < 0:
            tags = [sample.background, sample.background_color]
        else:
            obj = sample.objects[owner[p]]
            tags = [obj.color, obj.shape, obj.size, obj.fill, *obj.position.split()]
        targets[p, [index[t] for t in tags]] = 1.0
    return targets


def make_example(seed: int, question_share: float, focus_questions: bool = False, patch_size: int = 8,
                 dense_share: float = 0.0) -> Example:
    """The training example of ``seed``: a description, or (with ``question_share``) one question,
    or (with ``dense_share``, drawn first) a dense description (``shapes.dense``).

    With ``focus_questions`` the question is drawn only from those whose answer is an object's
    colour, shape or fill (the attributes that need object-level grounding). ``patch_size`` is
    the vision tower's, for the patch-word targets.
    """
    if seed >= HELD_OUT_SEED_START:
        raise ValueError(f"training seed {seed} is in the held-out range (>= {HELD_OUT_SEED_START})")
    sample = make_sample(seed)
    rng = random.Random(seed * 7919 + 17)
    patches = patch_attribute_targets(sample, patch_size)
    if dense_share > 0 and rng.random() < dense_share:  # no draw at 0: older runs replay unchanged
        return Example(sample.image, DENSE_INSTRUCTION, dense_description(sample), patches)
    if rng.random() < question_share:
        pairs = question_answers(sample, rng)
        if focus_questions:
            pairs = [(q, a) for q, a in pairs if a in COLORS or a in SHAPES or a in FILLS]
        if pairs:
            question, answer = pairs[rng.randrange(len(pairs))]
            return Example(sample.image, question, answer, patches)
    return Example(sample.image, DESCRIBE_INSTRUCTION, sample.description, patches)


def collate(examples: list[Example], processor: LlavaProcessor) -> dict[str, torch.Tensor]:
    """Right-padded teacher-forcing batch; labels are -100 everywhere but the answer and its eos.

    ``patch_targets`` is not a model input: the training loop pops it for the auxiliary loss.
    """
    tokenizer = processor.tokenizer
    prompts = processor(
        text=[prompt_text(e.instruction) for e in examples],
        images=[e.image for e in examples],
        return_tensors="np",
        padding=False,
    )
    rows: list[list[int]] = []
    label_rows: list[list[int]] = []
    for prompt_ids, example in zip(prompts["input_ids"], examples):
        prompt_ids = list(prompt_ids)
        answer_ids = tokenizer.encode(example.answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        label_rows.append([IGNORE_INDEX] * len(prompt_ids) + answer_ids)
    length = max(len(r) for r in rows)
    batch = len(rows)
    input_ids = torch.full((batch, length), tokenizer.pad_token_id, dtype=torch.long)  # [B, T]
    labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((batch, length), dtype=torch.long)  # [B, T]
    for i, (ids, lab) in enumerate(zip(rows, label_rows)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention_mask[i, : len(ids)] = 1
    pixel_values = torch.as_tensor(np.asarray(prompts["pixel_values"]), dtype=torch.float32)  # [B, 3, H, W]
    patch_targets = torch.as_tensor(np.stack([e.patch_targets for e in examples]))  # [B, P, len(PATCH_WORDS)]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "pixel_values": pixel_values,
        "labels": labels,
        "patch_targets": patch_targets,
    }


def training_batch(step: int, batch_size: int, processor: LlavaProcessor, question_share: float,
                   focus_questions: bool = False, dense_share: float = 0.0) -> dict[str, torch.Tensor]:
    """The batch of optimizer step ``step`` (deterministic)."""
    seeds = range(step * batch_size, (step + 1) * batch_size)
    patch_size = processor.patch_size
    examples = [make_example(seed, question_share, focus_questions, patch_size, dense_share) for seed in seeds]
    return collate(examples, processor)
