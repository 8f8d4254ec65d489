"""``raydec train --config CONFIG``: train ViSpec / EAGLE draft models for a target (what
``jobs/train_vispec.py`` runs).

Generates the training data with the target as a Ray Data job (reused when already present
with the same settings), trains each draft model of the config with Ray Train's TorchTrainer and
saves it (safetensors + draft_config.json, loss curve, train_log.json); with `evaluate:` set,
measures acceptance on held-out images and writes a MODEL_CARD.md per draft model.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys

from pydantic import ValidationError

from raydec.train.config import DraftTrainingConfig
from raydec.validation import config_error_line, validation_problems


def main(argv: list[str] | None = None, prog: str = "raydec train") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0],
                                     epilog="Images: data.images (and evaluate.images) name your own image dataset; unset, "
                                            "the shapes world's (raydec.reference.shapes.sample_images).")
    parser.add_argument("--config", required=True, help="YAML training file (see jobs/configs/train_vispec_*.yaml)")
    parser.add_argument("--steps", type=int, help="override every draft model's steps")
    parser.add_argument("--samples", type=int, help="override data.num_samples")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from raydec.train.run import preflight_draft_training, run_draft_training  # lazy: keeps raydec train --help light

    try:  # a bad config, target or output folder: one clear message, before Ray starts
        training = DraftTrainingConfig.from_yaml(args.config)
        values = training.model_dump(exclude_unset=True)  # what the file set stays what was set (checks read it)
        if args.samples is not None:
            values.setdefault("data", {})["num_samples"] = args.samples
        if args.steps is not None:
            for draft_model in values.setdefault("draft_models", [{}]):
                draft_model["steps"] = args.steps
        try:  # overrides are checked like the file (a 0 or negative count is an error, not ignored)
            training = DraftTrainingConfig.model_validate(values)
        except ValidationError as error:
            parser.error("bad override: " + "; ".join(validation_problems(error)))
        preflight_draft_training(training)
    except ValueError as exc:
        raise SystemExit(config_error_line(args.config, exc)) from None
    command = f"{prog} " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    from raydec.reference.shapes import sample_images  # the images when data.images (or evaluate.images) is unset

    result = run_draft_training(training, sample_images, command=command)
    print(json.dumps(result, indent=2, default=str))
    return 0
