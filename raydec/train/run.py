"""A whole draft model training run: generate data (or reuse it), train each draft model, evaluate,
write model cards."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raydec.io.datasets import check_dataset
from raydec.io.filesystem import publish_folder
from raydec.models.base import CheckpointError
from raydec.models.hf_vlm import SUPPORTED_VLMS
from raydec.models.registry import checkpoint_model_type, resolve_vlm_path
from raydec.runtime.cluster import connect_ray
from raydec.train.card import write_model_card
from raydec.train.config import METHOD_OF_VISION, DraftTrainConfig, DraftTrainingConfig
from raydec.train.datagen import ImageSource, generate_dataset, read_manifest
from raydec.train.evaluate import measure_acceptance
from raydec.train.trainer import train_draft_model
from raydec.validation import check_folder

logger = logging.getLogger(__name__)


def preflight_draft_training(training: DraftTrainingConfig) -> list[DraftTrainConfig]:
    """Fail before Ray starts and before hours of data generation, naming the field: a target
    that is no supported VLM checkpoint, an image dataset that is missing or lacks its columns,
    or an output folder a file stands in. -> the draft models to train, their data_dir resolved."""
    draft_models = training.resolved_draft_models()
    if any(d.data_dir == training.data.output_dir for d in draft_models):  # this run generates the data
        try:
            model_type = checkpoint_model_type(resolve_vlm_path(training.data.target))
        except (FileNotFoundError, ValueError) as exc:
            raise CheckpointError(f"data.target: {training.data.target!r}: {exc}") from None
        if model_type not in SUPPORTED_VLMS:
            raise CheckpointError(f"data.target: {training.data.target!r} is a {model_type!r} checkpoint; drafts train for {sorted(SUPPORTED_VLMS)}")

    for field, images in (("data.images", training.data.images), ("evaluate.images", training.evaluate and training.evaluate.images)):
        if images is not None:  # listed and its columns checked (file footers and headers only)
            try:
                check_dataset(images.model_copy(update={"s3": images.s3.resolved()}), "caption")
            except ValueError as exc:
                raise ValueError(f"{field}: {exc}") from None
    check_folder(training.data.output_dir, "data.output_dir")
    for index, draft_model in enumerate(draft_models):
        check_folder(draft_model.output_dir, f"draft_models[{index}].output_dir")
    return draft_models


def run_draft_training(training: DraftTrainingConfig, image_source: ImageSource, command: str = "") -> dict[str, Any]:
    """Run ``training``; returns {"data": manifest summary, "drafts": [summaries], "acceptance": {...}}.
    image_source: seeds -> images, for the generated data and the evaluation (see
    ``raydec.train.datagen.generate_dataset``)."""
    draft_models = preflight_draft_training(training)
    uses_run_data = any(d.data_dir == training.data.output_dir for d in draft_models)
    manifest = generate_dataset(training.data, image_source) if uses_run_data else read_manifest(draft_models[0].data_dir)

    connect_ray()  # once, here: trainers started from several threads must not each start a cluster
    start = time.time()
    if training.parallel and len(draft_models) > 1:
        with ThreadPoolExecutor(max_workers=len(draft_models)) as pool:
            summaries = list(pool.map(train_draft_model, draft_models))
    else:
        summaries = [train_draft_model(d) for d in draft_models]
    logger.info("trained %d draft(s) in %.0f s", len(draft_models), time.time() - start)
    acceptance: dict[str, Any] = {}
    if training.evaluate is not None:
        paths = {METHOD_OF_VISION[d.vision]: d.output_dir for d in draft_models}
        acceptance = measure_acceptance(manifest["target"], paths, training.evaluate, image_source)
        for draft_model, summary in zip(draft_models, summaries):
            write_model_card(draft_model, summary, manifest, acceptance, training.evaluate, command, parallel=training.parallel)
    for draft_model, summary in zip(draft_models, summaries):
        if draft_model.publish_to is not None:
            summary["published"] = publish_folder(draft_model.output_dir, draft_model.publish_to)
            logger.info("draft %s published to %s", draft_model.name, summary["published"])
    data = {k: manifest[k] for k in ("num_samples", "num_tokens", "num_generated_tokens", "wall_s") if k in manifest}
    result = {"data": data, "drafts": summaries, "acceptance": acceptance}
    logger.info("draft model training done: %s", json.dumps(result, default=str))
    return result
