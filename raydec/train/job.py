"""The whole draft job: generate data (or reuse it), train each draft, evaluate, write model cards."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raydec.train.config import METHOD_OF_VISION, DraftJobConfig, DraftTrainConfig
from raydec.train.datagen import ImageSource

logger = logging.getLogger(__name__)


def preflight_draft_job(job: DraftJobConfig) -> list[DraftTrainConfig]:
    """Fail before Ray starts and before hours of data generation, naming the field: a target
    that is no supported VLM checkpoint, an image dataset that is missing or lacks its columns,
    or an output folder a file stands in. -> the drafts, their data_dir resolved."""
    from raydec.models.base import CheckpointError
    from raydec.models.hf_vlm import SUPPORTED_VLMS
    from raydec.models.registry import checkpoint_model_type, resolve_vlm_path
    from raydec.validation import check_folder

    drafts = job.resolved_drafts()
    if any(d.data_dir == job.data.output_dir for d in drafts):  # this job generates the data
        try:
            model_type = checkpoint_model_type(resolve_vlm_path(job.data.target))
        except (FileNotFoundError, ValueError) as exc:
            raise CheckpointError(f"data.target: {job.data.target!r}: {exc}") from None
        if model_type not in SUPPORTED_VLMS:
            raise CheckpointError(f"data.target: {job.data.target!r} is a {model_type!r} checkpoint; drafts train for {sorted(SUPPORTED_VLMS)}")
    from raydec.io.datasets import check_dataset

    for field, images in (("data.images", job.data.images), ("evaluate.images", job.evaluate and job.evaluate.images)):
        if images is not None:  # listed and its columns checked (file footers and headers only)
            try:
                check_dataset(images.model_copy(update={"s3": images.s3.resolved()}), "caption")
            except ValueError as exc:
                raise ValueError(f"{field}: {exc}") from None
    check_folder(job.data.output_dir, "data.output_dir")
    for index, draft in enumerate(drafts):
        check_folder(draft.output_dir, f"drafts[{index}].output_dir")
    return drafts


def run_draft_job(job: DraftJobConfig, image_source: ImageSource, command: str = "") -> dict[str, Any]:
    """Run ``job``; returns {"data": manifest summary, "drafts": [summaries], "acceptance": {...}}.
    image_source: seeds -> images, for the generated data and the evaluation (see
    ``raydec.train.datagen.generate_dataset``)."""
    from raydec.train.card import write_model_card
    from raydec.train.datagen import generate_dataset, read_manifest
    from raydec.train.evaluate import measure_acceptance
    from raydec.train.trainer import train_draft

    drafts = preflight_draft_job(job)
    uses_job_data = any(d.data_dir == job.data.output_dir for d in drafts)
    manifest = generate_dataset(job.data, image_source) if uses_job_data else read_manifest(drafts[0].data_dir)
    from raydec.runtime.cluster import connect_ray

    connect_ray()  # once, here: trainers started from several threads must not each start a cluster
    start = time.time()
    if job.parallel and len(drafts) > 1:
        with ThreadPoolExecutor(max_workers=len(drafts)) as pool:
            summaries = list(pool.map(train_draft, drafts))
    else:
        summaries = [train_draft(d) for d in drafts]
    logger.info("trained %d draft(s) in %.0f s", len(drafts), time.time() - start)
    acceptance: dict[str, Any] = {}
    if job.evaluate is not None:
        paths = {METHOD_OF_VISION[d.vision]: d.output_dir for d in drafts}
        acceptance = measure_acceptance(manifest["target"], paths, job.evaluate, image_source)
        for draft, summary in zip(drafts, summaries):
            write_model_card(draft, summary, manifest, acceptance, job.evaluate, command, parallel=job.parallel)
    data = {k: manifest[k] for k in ("num_samples", "num_tokens", "num_generated_tokens", "wall_s") if k in manifest}
    result = {"data": data, "drafts": summaries, "acceptance": acceptance}
    logger.info("draft job done: %s", json.dumps(result, default=str))
    return result
