"""Settings and log of one training run of the reference VLM (:mod:`raydec.reference.llava.train`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from raydec.reference.llava.model import DEFAULT_WEIGHTS_DIR


@dataclass
class TrainSettings:
    """Knobs of one training run."""

    out_dir: Path = DEFAULT_WEIGHTS_DIR
    steps: int = 2400
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: int = 150
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    seed: int = 0
    question_share: float = 0.25
    patch_loss_weight: float = 0.5
    vision_lr_mult: float = 1.0  # learning-rate multiplier of the vision tower and the projector
    projector_in_lr_mult: float = 1.0  # extra multiplier of the projector's first linear layer
    stop_after: int = 0  # stop (and checkpoint) after this many steps of this phase, schedule unchanged (0: off)
    revive_projector: bool = False  # re-initialise dead projector units at the start (function-preserving)
    # Weight of a training-only linear probe that must read each patch's words (as the patch
    # loss does, same targets) straight from the projector's output, so that what the LM is
    # handed keeps the colour / shape / fill linearly (0: off). The probe is not saved.
    projector_probe_weight: float = 0.0
    focus_questions: bool = False  # questions only about an object's colour, shape or fill
    eval_every: int = 300
    eval_n: int = 24
    max_minutes: float = 0.0
    threads: int = 1
    bf16: bool = False
    init_from: Path | None = None  # continue from a saved checkpoint (a second phase) instead of from scratch
    # Make the init_from model's image patches this many times finer before training (0: off);
    # see raydec.reference.llava.refine.
    refine_patches: int = 0
    # Share of dense descriptions ("describe the image in detail ."; raydec.reference.shapes.dense)
    # among the examples; > 0 adds their words to the vocabulary (existing ids kept).
    dense_share: float = 0.0
    max_positions: int = 0  # raise the language model's max_position_embeddings to this (0: keep)
    first_step: int = 0  # data offset: this phase's step s uses the batch of global step first_step + s


@dataclass
class TrainLog:
    """What the run did, saved as JSON next to the weights."""

    settings: dict
    sizes: dict
    parameters: int = 0
    losses: list[float] = field(default_factory=list)
    patch_losses: list[float] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    tokens_seen: int = 0
    wall_seconds: float = 0.0
    steps_done: int = 0
    stopped_early: bool = False
    phases: list[dict] = field(default_factory=list)  # settings of every phase, oldest first
