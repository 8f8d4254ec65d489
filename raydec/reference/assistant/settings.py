"""The settings and the log of one LLaVA assistant build + distill run.

``AssistantSettings`` holds every knob (target, layers copied, the caption data and its
temperatures, optimisation, time caps, the final tuning and measurement) with the default
folders; ``DistillLog`` is what the run did, saved as ``train_log.json`` next to the weights
and read back by the model card (:mod:`raydec.reference.assistant.card`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from raydec.reference.llava.model import DEFAULT_WEIGHTS_DIR

DEFAULT_ASSISTANT_DIR = Path(__file__).parent.parent / "weights" / "vlm-drafts" / "assistant"
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
