"""The settings of one reference text-to-image training run: ``T2ISettings``.

Every knob of :func:`raydec.reference.janus.train.train_t2i` (data, the VQ-VAE stage, the
language-model stage, the texture phase, checkpoints and time caps) and the default output
folder, the shipped weights ``raydec/reference/weights/t2i``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from raydec.reference.janus import model as jt

DEFAULT_OUT_DIR = Path(__file__).resolve().parent.parent / "weights" / "t2i"


@dataclass
class T2ISettings:
    """Every knob of one from-scratch training run."""

    out_dir: Path = DEFAULT_OUT_DIR
    work_dir: Path = Path("/tmp/raydec_t2i_work")
    seed: int = 0
    num_images: int = 30_000
    vq_steps: int = 8000
    vq_batch_size: int = 8
    vq_crop: int = 32
    vq_full_image_steps: int = 150
    vq_kmeans_images: int = 3000
    vq_kmeans_iterations: int = 25
    vq_logit_scale: float = 20.0
    vq_code_weight: float = 0.2
    vq_lr: float = 2e-3
    vq_color_weight: float = 3.0
    lm_steps: int = 4600
    lm_batch_size: int = 16
    lm_lr: float = 1.5e-3
    lm_warmup: int = 100
    lm_weight_decay: float = 0.05
    # Tokens inside an object's box carry the prompt's colour, shape and fill; the other ~92%
    # are background a model learns by copying its neighbours. From step ``lm_object_weight_from``
    # on, object tokens weigh ``lm_object_weight`` in the LM loss (1.0: plain cross-entropy).
    lm_object_weight: float = 4.0
    lm_object_weight_from: int = 2800
    # The colour / shape / fill words are needed at one token per object (the first one drawn;
    # the rest copy their neighbours), too sparse a signal for the model to learn to read them.
    # From ``lm_attribute_from`` on, a linear probe on the hidden state that draws each
    # object-box token must name that object's colour, shape and fill (cross-entropy, weight
    # ``lm_attribute_weight``; 0: off). The probe is training-only and not saved.
    lm_attribute_weight: float = 0.5
    lm_attribute_from: int = 2800
    uncond_share: float = 0.1
    max_extra_left_pad: int = 3
    guidance_scale: float = 3.0
    checkpoint_every: int = 200
    max_minutes: float = 0.0
    threads: int = 1
    resume: bool = False
    # The world's texture ("iid" or "runs", see raydec.reference.shapes). Not "iid" and
    # texture_steps > 0: train on "iid" first, then continue the LM texture_steps on it.
    texture: str = "runs"
    texture_steps: int = 1000
    texture_lr: float = 5e-4
    texture_warmup: int = 50
    # A saved T2I folder: continue its language model (the VQ-VAE is kept; no VQ stage).
    init_from: Path | None = None
    arch: jt.T2IArchitecture = field(default_factory=jt.T2IArchitecture)
