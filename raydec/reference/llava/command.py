"""``python -m raydec.reference.train vlm``: its flags and the call that trains (or replays the
recorded recipe of) the reference VLM."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from raydec.reference.llava.model import DEFAULT_WEIGHTS_DIR, VLMSizes
from raydec.reference.llava.recipe import replay_recipe
from raydec.reference.llava.settings import TrainSettings
from raydec.reference.llava.train import run_training


def add_vlm_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags of ``python -m raydec.reference.train vlm``."""
    group = parser.add_argument_group("vlm")
    group.add_argument("--vlm-out", type=Path, default=DEFAULT_WEIGHTS_DIR, help="output folder for the weights")
    group.add_argument("--vlm-steps", type=int, default=2400, help="optimizer steps")
    group.add_argument("--vlm-batch-size", type=int, default=16, help="sequences per step")
    group.add_argument("--vlm-lr", type=float, default=2e-3, help="peak learning rate (AdamW)")
    group.add_argument("--vlm-warmup", type=int, default=150, help="linear warm-up steps")
    group.add_argument("--vlm-seed", type=int, default=0, help="seed of initialisation and data order")
    group.add_argument("--vlm-question-share", type=float, default=0.25, help="share of question samples")
    group.add_argument("--vlm-patch-loss", type=float, default=0.5, help="weight of the auxiliary patch-word loss")
    group.add_argument("--vlm-vision-lr-mult", type=float, default=1.0,
                       help="learning-rate multiplier of the vision tower and projector")
    group.add_argument("--vlm-projector-in-lr-mult", type=float, default=1.0,
                       help="extra learning-rate multiplier of the projector's first linear layer")
    group.add_argument("--vlm-revive-projector", action="store_true",
                       help="re-initialise dead projector units at the start (function-preserving)")
    group.add_argument("--vlm-projector-probe", type=float, default=0.0,
                       help="weight of a training-only probe reading patch words from the projector output (0: off)")
    group.add_argument("--vlm-focus-questions", action="store_true",
                       help="questions only about an object's colour, shape or fill")
    group.add_argument("--vlm-eval-every", type=int, default=300, help="steps between checkpoints + quick evals")
    group.add_argument("--vlm-eval-n", type=int, default=24, help="held-out images per quick eval")
    group.add_argument("--vlm-max-minutes", type=float, default=0.0, help="stop early after this wall time (0: off)")
    group.add_argument("--vlm-stop-after", type=int, default=0,
                       help="stop after this many steps of the phase, keeping the --vlm-steps schedule (0: off)")
    group.add_argument("--vlm-init-from", type=Path, default=None, help="continue from this saved checkpoint")
    group.add_argument("--vlm-first-step", type=int, default=0, help="global step of this phase's first batch")
    group.add_argument("--vlm-refine-patches", type=int, default=0,
                       help="with --vlm-init-from: make its image patches this many times finer first (0: off)")
    group.add_argument("--vlm-dense-share", type=float, default=0.0,
                       help="share of dense descriptions ('describe the image in detail .'); > 0 extends the vocabulary")
    group.add_argument("--vlm-max-positions", type=int, default=0,
                       help="raise the language model's max_position_embeddings to this (0: keep)")
    group.add_argument("--vlm-recipe", type=Path, default=None,
                       help="retrain from scratch by replaying every phase recorded in this train_log.json "
                            "(e.g. raydec/reference/weights/vlm/train_log.json); other training flags are ignored")
    group.add_argument("--vlm-threads", type=int, default=1, help="torch CPU threads")
    group.add_argument("--vlm-bf16", action="store_true", help="bf16 autocast (slower than float32 on CPUs without bf16 units)")
    group.add_argument("--vlm-text-layers", type=int, default=VLMSizes.text_layers)
    group.add_argument("--vlm-text-hidden", type=int, default=VLMSizes.text_hidden)
    group.add_argument("--vlm-text-intermediate", type=int, default=VLMSizes.text_intermediate)
    group.add_argument("--vlm-vision-layers", type=int, default=VLMSizes.vision_layers)


def _get(args: Any, name: str, default: Any) -> Any:
    """Read ``args.<name>`` with a default, so a bare Namespace from another CLI also works."""
    return getattr(args, name, default) if args is not None else default


def train_vlm(args: Any = None) -> Path:
    """Train the reference VLM from scratch and save it; returns the output folder."""
    recipe = _get(args, "vlm_recipe", None)
    if recipe is not None:
        return replay_recipe(Path(recipe), Path(_get(args, "vlm_out", DEFAULT_WEIGHTS_DIR)))

    sizes = VLMSizes(
        text_layers=_get(args, "vlm_text_layers", VLMSizes.text_layers),
        text_hidden=_get(args, "vlm_text_hidden", VLMSizes.text_hidden),
        text_intermediate=_get(args, "vlm_text_intermediate", VLMSizes.text_intermediate),
        vision_layers=_get(args, "vlm_vision_layers", VLMSizes.vision_layers),
    )
    defaults = TrainSettings()
    settings = TrainSettings(
        out_dir=Path(_get(args, "vlm_out", defaults.out_dir)),
        steps=_get(args, "vlm_steps", defaults.steps),
        batch_size=_get(args, "vlm_batch_size", defaults.batch_size),
        lr=_get(args, "vlm_lr", defaults.lr),
        warmup=_get(args, "vlm_warmup", defaults.warmup),
        seed=_get(args, "vlm_seed", defaults.seed),
        question_share=_get(args, "vlm_question_share", defaults.question_share),
        patch_loss_weight=_get(args, "vlm_patch_loss", defaults.patch_loss_weight),
        vision_lr_mult=_get(args, "vlm_vision_lr_mult", defaults.vision_lr_mult),
        focus_questions=_get(args, "vlm_focus_questions", defaults.focus_questions),
        projector_in_lr_mult=_get(args, "vlm_projector_in_lr_mult", defaults.projector_in_lr_mult),
        revive_projector=_get(args, "vlm_revive_projector", defaults.revive_projector),
        projector_probe_weight=_get(args, "vlm_projector_probe", defaults.projector_probe_weight),
        stop_after=_get(args, "vlm_stop_after", defaults.stop_after),
        eval_every=_get(args, "vlm_eval_every", defaults.eval_every),
        eval_n=_get(args, "vlm_eval_n", defaults.eval_n),
        max_minutes=_get(args, "vlm_max_minutes", defaults.max_minutes),
        threads=_get(args, "vlm_threads", defaults.threads),
        bf16=_get(args, "vlm_bf16", False),
        init_from=_get(args, "vlm_init_from", None),
        first_step=_get(args, "vlm_first_step", 0),
        refine_patches=_get(args, "vlm_refine_patches", 0),
        dense_share=_get(args, "vlm_dense_share", 0.0),
        max_positions=_get(args, "vlm_max_positions", 0),
    )
    return run_training(settings, sizes)
