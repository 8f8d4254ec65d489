"""``python -m raydec.reference.train draft``: the ViSpec and the text-only EAGLE draft of the
reference VLM, trained on the same generated data with the same budget, evaluated and saved to
``raydec/reference/weights/vlm-drafts/{vispec,eagle}`` with a MODEL_CARD.md each."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from raydec.config import DraftTreeConfig

DRAFTS_DIR = Path(__file__).resolve().parent.parent / "weights" / "vlm-drafts"


def temperatures_arg(text: str) -> list[float]:
    """``--temperatures 0,1`` -> [0.0, 1.0] (range checked by ``DataGenConfig``)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0,1, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one temperature, got {text!r}")
    return values


def add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m raydec.reference.train draft``."""
    from raydec.train.config import DataGenConfig, DraftTrainConfig, EvalConfig

    data, train, evaluation, tree = DataGenConfig(), DraftTrainConfig(), EvalConfig(), DraftTreeConfig()
    parser.add_argument("--target", default="reference", help="target VLM ('reference' or a folder)")
    parser.add_argument("--out", type=Path, default=DRAFTS_DIR, help="parent folder of vispec/ and eagle/")
    parser.add_argument("--data-dir", type=Path, default=Path("out/draft_data_reference"), help="generated data (reused when present)")
    parser.add_argument("--samples", type=int, default=data.num_samples, help="image-prompt pairs (seeds 0..N-1)")
    parser.add_argument("--gen-workers", type=int, default=data.workers, help="Ray Data actors for data generation")
    parser.add_argument("--gen-batch-size", type=int, default=data.batch_size)
    parser.add_argument("--prompt", default=data.prompt,
                        help="instruction for every image, in data and evaluation (e.g. 'describe the image in detail .')")
    parser.add_argument("--max-new-tokens", type=int, default=data.max_new_tokens, help="answer cap, data and evaluation")
    parser.add_argument("--temperatures", type=temperatures_arg, default=data.temperatures,
                        help="answer temperatures cycled over the samples, e.g. 0,1 (0: greedy)")
    parser.add_argument("--methods", default="vispec,eagle", help="drafts to train: vispec, eagle or both")
    parser.add_argument("--steps", type=int, default=train.steps)
    parser.add_argument("--batch-size", type=int, default=train.batch_size)
    parser.add_argument("--lr", type=float, default=train.lr)
    parser.add_argument("--warmup", type=int, default=train.warmup_steps)
    parser.add_argument("--num-q", type=int, default=train.num_q)
    parser.add_argument("--mtp-steps", type=int, default=train.mtp_steps)
    parser.add_argument("--feature-noise", type=float, default=train.feature_noise)
    parser.add_argument("--stage1-steps", type=int, default=train.stage1_steps)
    parser.add_argument("--workers", type=int, default=train.num_workers, help="Ray Train workers per draft")
    parser.add_argument("--threads", type=int, default=train.threads_per_worker, help="torch threads per worker")
    parser.add_argument("--cpus-per-worker", type=float, default=train.cpus_per_worker)
    parser.add_argument("--max-minutes", type=float, default=train.max_minutes, help="time cap per draft (0: off)")
    parser.add_argument("--anneal-on-time", action="store_true", help="cosine decay ends at --max-minutes if that comes first")
    parser.add_argument("--seed", type=int, default=train.seed)
    parser.add_argument("--parallel", action="store_true", help="train the drafts at the same time")
    parser.add_argument("--eval-images", type=int, default=evaluation.num_images, help="held-out images (0: no evaluation)")
    parser.add_argument("--depth", type=int, default=tree.depth, help="evaluation tree depth")
    parser.add_argument("--top-k", type=int, default=tree.top_k, help="evaluation tree top_k")
    parser.add_argument("--total-tokens", type=int, default=tree.total_tokens, help="evaluation tree size")


def job_from_args(args: argparse.Namespace) -> Any:
    """A ``DraftTrainingConfig`` from parsed flags (both draft models share every training setting)."""
    from raydec.train.config import DataGenConfig, DraftTrainConfig, DraftTrainingConfig, EvalConfig

    data = DataGenConfig(
        target=args.target, output_dir=args.data_dir, num_samples=args.samples, workers=args.gen_workers,
        batch_size=args.gen_batch_size, max_new_tokens=args.max_new_tokens, temperatures=args.temperatures,
        prompt=args.prompt,
    )
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - {"vispec", "eagle"}
    if unknown or not methods:
        raise SystemExit(f"--methods: use vispec, eagle or both, got {args.methods!r}")
    shared = dict(
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup, num_q=args.num_q,
        mtp_steps=args.mtp_steps, feature_noise=args.feature_noise, stage1_steps=args.stage1_steps,
        num_workers=args.workers, threads_per_worker=args.threads, cpus_per_worker=args.cpus_per_worker,
        max_minutes=args.max_minutes, anneal_on_time=args.anneal_on_time, seed=args.seed, work_dir=args.data_dir.parent / "_ray_train",
    )
    draft_models = [DraftTrainConfig(name=m, vision=m == "vispec", output_dir=args.out / m, **shared) for m in methods]
    evaluation = None
    if args.eval_images > 0:
        tree = DraftTreeConfig(depth=args.depth, top_k=args.top_k, total_tokens=args.total_tokens)
        evaluation = EvalConfig(num_images=args.eval_images, draft_tree=tree, threads=args.threads, prompt=args.prompt,
                                max_new_tokens=args.max_new_tokens)
    return DraftTrainingConfig(data=data, draft_models=draft_models, parallel=args.parallel, evaluate=evaluation)


def train_drafts_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from raydec.reference.shapes import sample_images
    from raydec.train.run import run_draft_training

    command = "python -m raydec.reference.train " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    return run_draft_training(job_from_args(args), sample_images, command=command)
