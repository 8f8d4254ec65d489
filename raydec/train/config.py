"""Typed configs of ViSpec / EAGLE draft model training: data generation, training, evaluation.

``DraftTrainingConfig.from_yaml(path)`` validates a training run's file (``jobs/configs/train_vispec_*.yaml``);
unknown keys are errors that name the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal, Sequence

from pydantic import Field, field_validator, model_validator

from raydec.config import DraftTreeConfig, StrictModel
from raydec.io.config import InputConfig
from raydec.models.source_names import parse_model_name

#: first held-out seed of the shapes world (training data must stay below it)
HELD_OUT_SEED_START = 1_000_000
#: the reference VLM's captioning prompt; it knows only its training prompts, so no "answer at
#: length" instruction is appended (it has never seen one and would answer worse)
DEFAULT_PROMPT = "describe the image ."
#: the decode method a draft model serves
METHOD_OF_VISION = {True: "vispec", False: "eagle"}


def check_temperatures(values: Sequence[float]) -> list[float]:
    """Answer temperatures for training data: each in [0, 10] (0 is greedy), at least one."""
    if len(values) == 0:
        raise ValueError("temperatures: give at least one (0 is greedy)")
    for index, temperature in enumerate(values):
        if not 0 <= temperature <= 10:
            raise ValueError(f"temperatures[{index}]: {temperature!r} must be in [0, 10] (0 is greedy)")
    return list(values)


def _absolute_target(value: str | None) -> str | None:
    """A local checkpoint folder as an absolute path: Ray workers do not share the driver's cwd (a hub id
    or s3:// target is kept as named)."""
    if value is None or value == "reference" or parse_model_name(value).remote:
        return value
    return os.path.abspath(Path(value).expanduser())


class DataGenConfig(StrictModel):
    """Data generation: the target answers a prompt about each image (greedily unless
    ``temperatures`` says otherwise); tensors go to shards. The images are the shapes world's,
    or your own dataset (``images``)."""

    target: str = Field("reference", description="Target VLM: 'reference', a local checkpoint folder, a hub id (org/name[@revision]) or s3://bucket/prefix (read with the AWS environment).")
    output_dir: Path = Field(Path("out/draft_data"), description="Folder for the Parquet shards and manifest.json.")
    images: InputConfig | None = Field(
        None,
        description="Your images: a dataset (Parquet, JSON lines or CSV; a local path or s3://) with an `image` column of "
        "encoded bytes or an `image_uri` column of paths / s3:// URIs, and optionally a `prompt` column asked instead of "
        "`prompt` (column names as in a captioning job's input). Its first num_samples rows are used; bad rows are "
        "skipped and logged. None: shapes-world images, seeds seed_start onwards.",
    )
    num_samples: int = Field(3000, ge=1, le=HELD_OUT_SEED_START, description="Image-prompt pairs to generate.")
    seed_start: int = Field(0, ge=0, description="First shapes-world seed (all seeds stay below 1,000,000).")
    prompt: str = Field(DEFAULT_PROMPT, min_length=1, description="Question asked about every image.")
    max_new_tokens: int = Field(128, ge=1, le=4096, description="Answer length cap per sample.")
    temperatures: list[float] = Field(
        default_factory=lambda: [0.0], min_length=1, max_length=16,
        description="Answer sampling temperatures, cycled over the samples (seed_start + i uses temperatures[i % n]); "
        "0 is greedy. A draft model that serves sampling needs sampled answers: greedy answers never show it the phrasings "
        "a sampled caption takes.",
    )
    batch_size: int = Field(32, ge=1, le=1024, description="Images captioned together (one engine batch).")
    workers: int = Field(2, ge=1, le=256, description="Ray Data actors running the target.")
    cpus_per_worker: float = Field(0.5, gt=0, le=64, description="CPUs each actor asks for (fractional on small nodes).")
    gpus_per_worker: float = Field(0.0, ge=0, le=8, description="GPUs each actor asks for (0: CPU).")
    threads_per_worker: int = Field(1, ge=1, le=256, description="torch CPU threads per actor.")
    storage_dtype: Literal["float16", "float32"] = Field("float16", description="dtype of stored embeddings and hidden states.")
    overwrite: bool = Field(False, description="Replace an existing dataset in output_dir (else reuse it).")

    @field_validator("target")
    @classmethod
    def _target_folder(cls, value: str) -> str:
        return _absolute_target(value)

    @field_validator("temperatures")
    @classmethod
    def _temperatures_in_range(cls, value: list[float]) -> list[float]:
        return check_temperatures(value)

    def temperature_of(self, seed: int) -> float:
        """The sampling temperature of the answer to sample ``seed`` (a shapes-world seed, or an
        image row's seed)."""
        return self.temperatures[(seed - self.seed_start) % len(self.temperatures)]

    @model_validator(mode="after")
    def _held_in(self) -> "DataGenConfig":
        if self.seed_start + self.num_samples > HELD_OUT_SEED_START:
            raise ValueError(
                f"seed_start={self.seed_start} + num_samples={self.num_samples} reaches the held-out seeds "
                f"(>= {HELD_OUT_SEED_START})"
            )
        return self


class LossConfig(StrictModel):
    """Stage 2 (ViSpec): ``l1_weight * L1(p_draft - p_target) + listmle_weight * ListMLE_top``.
    Stage 1 (text-only EAGLE): ``feature_weight * SmoothL1(h, f) + ce_weight * (CE + listmle_weight * ListMLE_top)``."""

    l1_weight: float = Field(10.0, ge=0, description="Stage 2: weight of the L1 distance of probabilities.")
    listmle_weight: float = Field(0.1, ge=0, description="Weight of ListMLE (both stages).")
    listmle_top: int = Field(10, ge=1, le=1000, description="ListMLE ranks the target's top-k tokens.")
    feature_weight: float = Field(1.0, ge=0, description="Stage 1: weight of SmoothL1 on features.")
    ce_weight: float = Field(0.1, ge=0, description="Stage 1: weight of (CE + listmle_weight * ListMLE).")


class DraftTrainConfig(StrictModel):
    """One draft model's training (Ray Train ``TorchTrainer``, data parallel)."""

    name: str = Field("vispec", min_length=1, description="Run name (logs, Ray Train run folder).")
    data_dir: Path | None = Field(None, description="Dataset folder (manifest.json); None: the training run's data.output_dir.")
    target: str | None = Field(None, description="Target VLM for lm_head (named as data.target); None: the one named in the manifest.")
    output_dir: Path = Field(Path("out/drafts/vispec"), description="Where the trained draft model is saved (from_pretrained layout).")
    publish_to: str | None = Field(
        None, pattern=r"^s3://[^/]+", description="s3://bucket/prefix: the trained draft folder (with its model card) is "
        "uploaded there at the end, weights first and configs last, for jobs and served models to name as draft_model; S3 "
        "access from the AWS environment. Unset: the local output_dir only.",
    )
    work_dir: Path | None = Field(None, description="Ray Train storage (checkpoints); None: output_dir/../_ray_train.")
    vision: bool = Field(True, description="ViSpec vision modules (False: the text-only EAGLE-2 draft model).")
    num_q: int = Field(2, ge=1, le=64, description="Adaptor queries (num_q - 1 compressed tokens + a global feature).")
    stage1_steps: int = Field(0, ge=0, description="First steps on the stage-1 (EAGLE) loss, the rest on stage 2.")
    loss: LossConfig = Field(default_factory=LossConfig, description="Loss terms and their weights.")
    steps: int = Field(2000, ge=1, le=10_000_000, description="Optimizer steps.")
    batch_size: int = Field(16, ge=1, le=65536, description="Global batch (samples per step, over all workers).")
    lr: float = Field(1e-3, gt=0, le=1.0, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(50, ge=0, description="Linear warm-up steps; cosine decay to min_lr_ratio after.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Learning rate at the end of the cosine decay, as a fraction of lr.")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas.")
    grad_clip: float = Field(1.0, ge=0, description="Gradient norm clip (0: off).")
    mtp_steps: int = Field(2, ge=0, le=16, description="Self-rollout passes on the draft model's own features after the first.")
    feature_noise: float = Field(0.2, ge=0, le=10, description="Width of uniform noise added to input features.")
    seed: int = Field(0, ge=0, description="Initialisation, data order and noise seed.")
    num_workers: int = Field(1, ge=1, le=1024, description="Ray Train workers (data parallel).")
    use_gpu: bool = Field(False, description="Workers on GPUs (NCCL); else CPU (gloo).")
    cpus_per_worker: float = Field(1.0, gt=0, le=256, description="CPUs each Ray Train worker asks for.")
    threads_per_worker: int = Field(1, ge=1, le=256, description="torch CPU threads per worker.")
    log_every: int = Field(25, ge=1, description="Log progress every this many steps.")
    checkpoint_every: int = Field(0, ge=0, description="Report a checkpoint every this many steps (0: only at the end).")
    max_minutes: float = Field(0.0, ge=0, description="Stop early after this many minutes of training (0: off).")
    anneal_on_time: bool = Field(
        False, description="Cosine decay follows the larger of step and time (max_minutes) progress: on a slow shared "
        "machine the schedule still ends when the time cap stops the run.",
    )

    @field_validator("target")
    @classmethod
    def _target_folder(cls, value: str | None) -> str | None:
        return _absolute_target(value)

    @field_validator("betas", mode="before")
    @classmethod
    def _betas_in_unit_interval(cls, value: object) -> object:
        if isinstance(value, (list, tuple)):
            for index, beta in enumerate(value):
                if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 1:
                    raise ValueError(f"betas[{index}]: {beta!r} must be a number in [0, 1)")
        return value

    @model_validator(mode="after")
    def _divisible(self) -> "DraftTrainConfig":
        if self.batch_size % self.num_workers:
            raise ValueError(f"batch_size={self.batch_size} must be a multiple of num_workers={self.num_workers}")
        return self


class EvalConfig(StrictModel):
    """Acceptance on held-out images: ``caption_images`` greedy, tokens per target forward."""

    num_images: int = Field(50, ge=1, le=100_000, description="Held-out images the draft models are measured on.")
    images: InputConfig | None = Field(
        None, description="Your held-out images (a dataset as data.images takes); its first num_images readable rows. "
        "None: shapes-world seeds from seed_start.",
    )
    seed_start: int = Field(HELD_OUT_SEED_START, ge=HELD_OUT_SEED_START, description="First held-out seed.")
    prompt: str = Field(DEFAULT_PROMPT, min_length=1, description="Question asked about every held-out image.")
    max_new_tokens: int = Field(128, ge=1, le=4096, description="Answer length cap per image.")
    batch_size: int = Field(10, ge=1, le=1024, description="Images captioned together.")
    methods: list[Literal["ar", "eagle", "vispec"]] = Field(
        default_factory=lambda: ["ar", "eagle", "vispec"], description="Methods measured side by side (ar is the baseline)."
    )
    draft_tree: DraftTreeConfig = Field(default_factory=DraftTreeConfig, description="Tree shape for the drafts.")
    threads: int = Field(1, ge=1, le=256, description="torch CPU threads for the measurement.")


class DraftTrainingConfig(StrictModel):
    """A whole training run: generate data (unless present), train each draft model, optionally evaluate and write cards."""

    data: DataGenConfig = Field(default_factory=DataGenConfig, description="The training data the target generates.")
    draft_models: list[DraftTrainConfig] = Field(
        default_factory=lambda: [DraftTrainConfig()], min_length=1, description="Draft models to train on that data (ViSpec, EAGLE).",
    )
    parallel: bool = Field(False, description="Train the draft models concurrently (each on its own workers).")
    evaluate: EvalConfig | None = Field(None, description="Measure acceptance and write MODEL_CARD.md files.")

    renamed_keys: ClassVar[dict[str, str]] = {"drafts": "draft_models"}

    @model_validator(mode="after")
    def _distinct_draft_models(self) -> "DraftTrainingConfig":
        outputs = [Path(d.output_dir).expanduser().resolve() for d in self.draft_models]
        for index, output in enumerate(outputs):
            if output in outputs[:index]:
                raise ValueError(f"draft_models[{index}].output_dir: {str(self.draft_models[index].output_dir)!r} "
                                 "is another draft model's too")
        if self.evaluate is not None:  # the evaluation measures one draft model per method
            kinds = [METHOD_OF_VISION[d.vision] for d in self.draft_models]
            for index, kind in enumerate(kinds):
                if kind in kinds[:index]:
                    raise ValueError(f"draft_models[{index}]: a second {kind} draft model; evaluate measures one per method")
        return self

    def resolved_draft_models(self) -> list[DraftTrainConfig]:
        """The draft models to train, ``data_dir`` defaulting to the generated dataset."""
        return [d if d.data_dir is not None else d.model_copy(update={"data_dir": self.data.output_dir}) for d in self.draft_models]
