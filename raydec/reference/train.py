"""Retrain a reference model from scratch: ``python -m raydec.reference.train t2i|vlm|assistant|draft [flags]``.

Each subcommand is an entry of :data:`SUBCOMMANDS`: a function that adds its flags to an
``argparse`` parser and a function that trains from the parsed namespace. Trainers are
imported lazily, so one model's dependencies never slow down or break another's command.
To add a model, add an entry (module path + function names).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Subcommand:
    """A trainer living in ``module``: ``add_arguments(parser)`` and ``run(args)``."""

    module: str
    add_arguments: str
    run: str
    help: str

    def resolve(self, name: str) -> Callable[..., Any]:
        """Import the module lazily and return its function ``name``."""
        try:
            module = importlib.import_module(self.module)
        except ModuleNotFoundError as error:
            raise SystemExit(f"trainer module {self.module!r} is not available: {error}") from error
        return getattr(module, name)


def add_t2i_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m raydec.reference.train t2i``."""
    from raydec.reference.janus.settings import T2ISettings

    d = T2ISettings()
    parser.add_argument("--out", type=Path, default=d.out_dir, help="output folder (from_pretrained layout)")
    parser.add_argument("--work-dir", type=Path, default=d.work_dir, help="caches and checkpoints (not shipped)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of initialisation and data order")
    parser.add_argument("--num-images", type=int, default=d.num_images, help="training images (seeds 0..N-1)")
    parser.add_argument("--vq-steps", type=int, default=d.vq_steps, help="VQ-VAE optimizer steps")
    parser.add_argument("--vq-batch-size", type=int, default=d.vq_batch_size)
    parser.add_argument("--vq-lr", type=float, default=d.vq_lr)
    parser.add_argument("--vq-crop", type=int, default=d.vq_crop, help="crop side of most VQ steps (64: none)")
    parser.add_argument("--vq-full-image-steps", type=int, default=d.vq_full_image_steps)
    parser.add_argument("--vq-kmeans-images", type=int, default=d.vq_kmeans_images, help="images the block k-means sees")
    parser.add_argument("--vq-kmeans-iterations", type=int, default=d.vq_kmeans_iterations)
    parser.add_argument("--lm-steps", type=int, default=d.lm_steps, help="language-model optimizer steps")
    parser.add_argument("--lm-batch-size", type=int, default=d.lm_batch_size)
    parser.add_argument("--lm-lr", type=float, default=d.lm_lr)
    parser.add_argument("--lm-warmup", type=int, default=d.lm_warmup, help="LM learning-rate warm-up steps")
    parser.add_argument(
        "--lm-object-weight", type=float, default=d.lm_object_weight, help="LM loss weight of object-box tokens"
    )
    parser.add_argument(
        "--lm-object-weight-from", type=int, default=d.lm_object_weight_from, help="first LM step that weighs objects"
    )
    parser.add_argument(
        "--lm-attribute-weight",
        type=float,
        default=d.lm_attribute_weight,
        help="weight of the training-only colour/shape/fill probe on object-box hidden states (0: off)",
    )
    parser.add_argument(
        "--lm-attribute-from", type=int, default=d.lm_attribute_from, help="first LM step with the attribute probe"
    )
    parser.add_argument("--lm-layers", type=int, default=d.arch.lm_num_layers)
    parser.add_argument("--lm-hidden", type=int, default=d.arch.lm_hidden_size)
    parser.add_argument("--lm-heads", type=int, default=d.arch.lm_num_heads)
    parser.add_argument("--lm-intermediate", type=int, default=d.arch.lm_intermediate_size)
    parser.add_argument("--guidance-scale", type=float, default=d.guidance_scale, help="saved CFG default")
    parser.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    parser.add_argument("--max-minutes", type=float, default=d.max_minutes, help="stop early after this (0: off)")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoints in --work-dir")
    parser.add_argument(
        "--texture",
        choices=["iid", "runs"],
        default=d.texture,
        help="how speckles and noisy ground are drawn (raydec.reference.shapes): independent blocks or horizontal runs; "
        "not iid: train on iid, then continue the LM --texture-steps on this texture",
    )
    parser.add_argument("--texture-steps", type=int, default=d.texture_steps, help="LM steps of the texture phase (0: none)")
    parser.add_argument("--texture-lr", type=float, default=d.texture_lr)
    parser.add_argument("--texture-warmup", type=int, default=d.texture_warmup)
    parser.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="a saved T2I folder: run only the texture phase, continuing its language model (its VQ-VAE is kept)",
    )
    parser.add_argument(
        "--stage",
        choices=["all", "vq", "lm"],
        default="all",
        help="train one stage only (to its checkpoint); run vq and lm in two processes, then --resume to assemble",
    )


def train_t2i_from_args(args: argparse.Namespace) -> Path:
    """Build :class:`T2ISettings` from parsed flags and train."""
    from raydec.reference.janus.model import T2IArchitecture
    from raydec.reference.janus.settings import T2ISettings
    from raydec.reference.janus.train import train_t2i

    arch = T2IArchitecture(
        lm_num_layers=args.lm_layers,
        lm_hidden_size=args.lm_hidden,
        lm_num_heads=args.lm_heads,
        lm_intermediate_size=args.lm_intermediate,
    )
    settings = T2ISettings(
        out_dir=args.out,
        work_dir=args.work_dir,
        seed=args.seed,
        num_images=args.num_images,
        vq_steps=args.vq_steps,
        vq_batch_size=args.vq_batch_size,
        vq_lr=args.vq_lr,
        vq_crop=args.vq_crop,
        vq_full_image_steps=args.vq_full_image_steps,
        vq_kmeans_images=args.vq_kmeans_images,
        vq_kmeans_iterations=args.vq_kmeans_iterations,
        lm_steps=args.lm_steps,
        lm_batch_size=args.lm_batch_size,
        lm_lr=args.lm_lr,
        lm_warmup=args.lm_warmup,
        lm_object_weight=args.lm_object_weight,
        lm_object_weight_from=args.lm_object_weight_from,
        lm_attribute_weight=args.lm_attribute_weight,
        lm_attribute_from=args.lm_attribute_from,
        guidance_scale=args.guidance_scale,
        checkpoint_every=args.checkpoint_every,
        max_minutes=args.max_minutes,
        threads=args.threads,
        resume=args.resume,
        texture=args.texture,
        texture_steps=args.texture_steps,
        texture_lr=args.texture_lr,
        texture_warmup=args.texture_warmup,
        init_from=args.init_from,
        arch=arch,
    )
    return train_t2i(settings, stages=("vq", "lm") if args.stage == "all" else (args.stage,))


SUBCOMMANDS: dict[str, Subcommand] = {
    "t2i": Subcommand(__name__, "add_t2i_arguments", "train_t2i_from_args", "the small Janus text-to-image model"),
    "vlm": Subcommand("raydec.reference.llava.command", "add_vlm_arguments", "train_vlm", "the small LLaVA VLM"),
    "assistant": Subcommand("raydec.reference.assistant.command", "add_assistant_arguments", "distill_from_args",
                            "a 1-2 layer LLaVA assistant distilled from the reference VLM (HF assisted generation)"),
    "draft": Subcommand("raydec.reference.llava.draft_command", "add_draft_arguments", "train_drafts_from_args",
                        "the reference VLM's ViSpec and EAGLE drafts (same data and budget)"),
}


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``<subcommand> [flags]`` and run that trainer."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "python -m raydec.reference.train {" + ",".join(SUBCOMMANDS) + "} [flags]"
    if not argv or argv[0] not in SUBCOMMANDS:
        lines = [f"usage: {usage}", ""] + [f"  {name:6s} {sub.help}" for name, sub in SUBCOMMANDS.items()]
        print("\n".join(lines), file=sys.stderr)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    name, rest = argv[0], argv[1:]
    sub = SUBCOMMANDS[name]
    parser = argparse.ArgumentParser(prog=f"python -m raydec.reference.train {name}", description=sub.help)
    add_arguments = sub.resolve(sub.add_arguments)
    add_arguments(parser)
    args = parser.parse_args(rest)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = sub.resolve(sub.run)(args)
    print(f"done: {result}")


if __name__ == "__main__":
    main()
