"""Draft training data written by the target itself, as a Ray Data job.

Per sample (one shapes-world image, seed < 1,000,000, and the prompt): the target captions the
image (``raydec.api.caption_images``, AR, batched), greedily or at the temperature
``DataGenConfig.temperatures`` gives the sample; one target forward over
prompt + answer (through the adapter, our own causal mask) gives the last hidden states
(after the final norm). Stored per sample, as one Parquet row:

    seed          int64
    length        int32     T = prompt + answer tokens
    prompt_len    int32     L
    input_ids     list<int32> [T]   prompt ids (image placeholders expanded) + answer ids
    image_index   list<int32> [T]   image of each position (-1 = text)
    loss_mask     list<bool>  [T]   True at generated tokens (positions >= L)
    embeds        binary    [T, H] layer-0 embeddings (image features merged; answer: token table)
    hidden        binary    [T, H] last hidden states
    answer        string

Tensors are stored in ``storage_dtype`` (row-major bytes; shape from ``length`` and the
manifest's ``hidden_size``). ``manifest.json`` beside the shards records the target, prompt,
seeds, dtype, counts and shard files.

The reference VLM is asked one of its own training prompts (``DataGenConfig.prompt``): "describe
the image ." for short captions, or "describe the image in detail ." for dense descriptions (a VLM
trained with ``--vlm-dense-share``); an instruction it has never seen would only make its
answers worse.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from raydec.api import caption_images, load_target
from raydec.config import DecodeConfig, SamplingConfig
from raydec.io.datasets import check_dataset
from raydec.io.fragments import fragment_items, fragment_tables, plan_fragments
from raydec.io.images import attach_caption_images
from raydec.io.storage import redact_secrets
from raydec.models.hf_vlm import VlmPrompt
from raydec.models.registry import resolve_vlm_path
from raydec.models.sources import folder_identity
from raydec.runtime.cluster import connect_ray
from raydec.train.config import DataGenConfig
from raydec.validation import check_folder

#: seeds -> one image per seed; where a draft's training and evaluation images come from
ImageSource = Callable[[Sequence[int]], list[Any]]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
SHARDS_DIR = "shards"
DATA_FORMAT = "raydec-draft-data/1"


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("seed", pa.int64()), ("length", pa.int32()), ("prompt_len", pa.int32()),
        ("input_ids", pa.list_(pa.int32())), ("image_index", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.bool_())), ("embeds", pa.binary()), ("hidden", pa.binary()),
        ("answer", pa.string()),
    ])


def _causal_mask(length: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, T, T] additive causal mask."""
    mask = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return mask[None, None]


def sequence_positions(inputs: Any, answer_length: int) -> torch.Tensor:
    """The target's positions for prompt + answer, as its own decoding gives them: the prompt's
    (1-D, or M-RoPE's [3, L] for Qwen) and, after it, the answer's text positions counting on
    from ``next_position`` on every axis. -> [1, T], or [P, 1, T] for multimodal rotary positions"""
    prompt_length = int(inputs.inputs_embeds.shape[0])
    if inputs.position_ids is None:
        return torch.arange(prompt_length + answer_length)[None]
    start = inputs.next_position if inputs.next_position is not None else prompt_length
    answer = start + torch.arange(answer_length)
    prompt = inputs.position_ids.long().cpu()
    if prompt.dim() == 1:
        return torch.cat([prompt, answer])[None]
    return torch.cat([prompt, answer.expand(prompt.shape[0], -1)], dim=1).unsqueeze(1)


@torch.inference_mode()
def sample_tensors(target: Any, prompt: Any, answer_ids: Sequence[int]) -> dict[str, torch.Tensor]:
    """One target forward over prompt + answer. -> input_ids [T], image_index [T], loss_mask [T],
    embeds [T, H] (layer-0), hidden [T, H] (last hidden states after the final norm)."""
    inputs = target.prompt_inputs(prompt)
    input_ids = target.processor_inputs(prompt)["input_ids"][0].long()
    prompt_len = int(inputs.inputs_embeds.shape[0])
    if input_ids.shape[0] != prompt_len:
        raise RuntimeError(f"processor gave {input_ids.shape[0]} ids for a {prompt_len}-position prompt")
    answer = torch.tensor(list(answer_ids), dtype=torch.long)
    embeds = torch.cat([inputs.inputs_embeds, target.embed_prompt_tokens(answer).to(inputs.inputs_embeds.dtype)])
    length = int(embeds.shape[0])
    positions = sequence_positions(inputs, len(answer))
    extra = {}
    if inputs.layer_residuals is not None:  # Qwen3-VL's DeepStack features: the prompt's, none for the answer
        residuals = inputs.layer_residuals
        residuals = torch.cat([residuals, residuals.new_zeros(residuals.shape[0], len(answer), residuals.shape[-1])], dim=1)
        extra["layer_residuals"] = residuals.unsqueeze(1).to(target.device, target.dtype)  # [K, 1, T, H]
    output = target.forward(embeds[None].to(target.device), None, positions, _causal_mask(length, target.dtype), None,
                            want_hidden=True, **extra)
    image_index = inputs.image_index if inputs.image_index is not None else torch.full((prompt_len,), -1)
    return {
        "input_ids": torch.cat([input_ids, answer]),
        "image_index": torch.cat([image_index.long().cpu(), torch.full((len(answer),), -1, dtype=torch.long)]),
        "loss_mask": torch.arange(length) >= prompt_len,
        "embeds": embeds.cpu(),
        "hidden": output.hidden[0].cpu(),
        "prompt_len": torch.tensor(prompt_len),
    }


def answers_at_temperatures(
    target: Any,
    images: Sequence[Any],
    prompts: str | Sequence[str],
    seeds: Sequence[int],
    temperature_of: Callable[[int], float],
    max_new_tokens: int,
    batch_size: int,
) -> list[Any]:
    """AR answers to ``images`` (one prompt, or one per row), row i at ``temperature_of(seeds[i])``.

    A sampled answer draws from a generator seeded by its image's seed: the same answer on any
    machine and in any batch. This is the rule of every answer a draft or assistant trains on.
    """
    rows = [prompts] * len(images) if isinstance(prompts, str) else list(prompts)
    results: list[Any] = [None] * len(seeds)
    for temperature in sorted({temperature_of(int(s)) for s in seeds}):
        group = [i for i, s in enumerate(seeds) if temperature_of(int(s)) == temperature]
        decode = DecodeConfig(method="ar", max_new_tokens=max_new_tokens, sampling=SamplingConfig(temperature=temperature))
        answers = caption_images([images[i] for i in group], prompt=[rows[i] for i in group], model=target, decode=decode,
                                 seeds=[int(seeds[i]) for i in group], batch_size=batch_size)
        for i, answer in zip(group, answers):
            results[i] = answer
    return results


def caption_seeds(target: Any, seeds: Sequence[int], images: Sequence[Any], config: DataGenConfig,
                  prompts: Sequence[str] | None = None) -> list[Any]:
    """AR answers to ``prompts`` (default: ``config.prompt``) about ``images``, sample i at
    ``config.temperature_of(seeds[i])`` (see :func:`answers_at_temperatures`)."""
    return answers_at_temperatures(target, images, config.prompt if prompts is None else list(prompts), seeds,
                                   config.temperature_of, config.max_new_tokens, config.batch_size)


def generate_rows(target: Any, seeds: Sequence[int], images: Sequence[Any], prompts: Sequence[str],
                  config: DataGenConfig) -> list[dict[str, Any]]:
    """The target's answers to ``prompts`` about ``images`` (:func:`caption_seeds`), one storage row each."""
    results = caption_seeds(target, seeds, images, config, prompts)
    store = np.float16 if config.storage_dtype == "float16" else np.float32
    rows = []
    for seed, image, prompt, result in zip(seeds, images, prompts, results):
        tensors = sample_tensors(target, VlmPrompt(target.format_prompt(prompt, 1), [image]), result.tokens)
        rows.append({
            "seed": int(seed),
            "length": int(tensors["input_ids"].shape[0]),
            "prompt_len": int(tensors["prompt_len"]),
            "input_ids": tensors["input_ids"].int().tolist(),
            "image_index": tensors["image_index"].int().tolist(),
            "loss_mask": tensors["loss_mask"].tolist(),
            "embeds": tensors["embeds"].float().numpy().astype(store).tobytes(),
            "hidden": tensors["hidden"].float().numpy().astype(store).tobytes(),
            "answer": result.caption,
        })
    return rows


class _TargetWorker:
    """Ray Data actor: loads the target once, turns a batch of samples into storage rows. A
    sample is a shapes-world seed (``image_source`` makes its image), or an image row of
    ``config.images`` (its bytes or URI, its prompt and seed; a row whose image cannot be read
    is skipped and logged)."""

    def __init__(self, config_json: str, image_source: ImageSource | None) -> None:
        self.image_source = image_source
        self.config = DataGenConfig.model_validate_json(config_json)
        torch.set_num_threads(self.config.threads_per_worker)
        device = "cuda" if self.config.gpus_per_worker > 0 and torch.cuda.is_available() else None
        self.target = load_target(self.config.target, task="caption", device=device)

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        if self.config.images is None:
            seeds = [int(s) for s in batch["seed"].to_pylist()]
            images, prompts = self.image_source(seeds), [self.config.prompt] * len(seeds)
        else:
            seeds, images, prompts = image_samples(batch.to_pylist(), self.config)
        return pa.Table.from_pylist(generate_rows(self.target, seeds, images, prompts, self.config), schema=_schema())


def image_samples(rows: list[dict[str, Any]], config: DataGenConfig) -> tuple[list[int], list[Any], list[str]]:
    """Validated image rows (``raydec.io`` caption rows) -> the seeds, decoded images and prompts
    of those that can be read (the rest are logged and skipped)."""
    seeds, images, prompts = [], [], []
    for row in attach_caption_images(rows, config.images.s3.resolved()):
        if row["error"]:
            logger.warning("data.images: skipping row %s: %s", row["id"], row["error"])
            continue
        seeds.append(int(row["seed"]))
        images.append(row["pil_image"])
        prompts.append(row["prompt"] or config.prompt)
    return seeds, images, prompts


def _read_image_rows(batch: Any, *, config_json: str) -> Any:
    """map_batches UDF: the validated rows of the image fragments in ``batch``."""
    config = DataGenConfig.model_validate_json(config_json)
    for item in batch.to_pylist():
        yield from fragment_tables(item, config.images, "caption")


def samples_dataset(config: DataGenConfig) -> Any:
    """The Dataset of the samples to answer: ``num_samples`` shapes-world seeds, or the first
    ``num_samples`` rows of ``config.images`` (read in Ray tasks, a fragment each: the driver
    reads file footers only)."""
    import ray.data

    blocks = max(1, math.ceil(config.num_samples / config.batch_size))
    if config.images is None:
        seeds = [{"seed": config.seed_start + i} for i in range(config.num_samples)]
        return ray.data.from_items(seeds, override_num_blocks=blocks)

    fragments = plan_fragments(check_dataset(config.images, "caption"), config.images)
    items = fragment_items(fragments, list(range(len(fragments))))
    return ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        _read_image_rows, batch_size=1, batch_format="pyarrow", fn_kwargs={"config_json": config.model_dump_json()}, num_cpus=0,
    ).limit(config.num_samples)


#: settings that decide a dataset's content (reuse needs them equal, and the same target weights)
CONTENT_FIELDS = ("target", "num_samples", "seed_start", "prompt", "max_new_tokens", "storage_dtype", "temperatures", "images")
#: values a content field had before it existed (a dataset written then matches a config that keeps them)
CONTENT_DEFAULTS = {"temperatures": [0.0], "images": None}


def content_identity(config: DataGenConfig, target_weights: str) -> dict[str, Any]:
    """What decides a dataset's content: its settings (an image dataset by where it is and how
    its columns are read, not by the credentials that reach it) and the target's weights."""
    identity = config.model_dump(mode="json", include=set(CONTENT_FIELDS))
    if config.images is not None:
        identity["images"] = config.images.model_dump(mode="json", exclude={"s3"})
    return {**identity, "target_weights": target_weights}


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """The manifest of a draft dataset; a folder that holds none, another kind or no samples is an error."""
    path = Path(data_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no draft dataset at {data_dir}: {MANIFEST_NAME} not found (generate it first)")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(f"data_dir: {path} is not valid JSON ({error})") from None
    kind = manifest.get("format") if isinstance(manifest, dict) else None
    if kind != DATA_FORMAT:
        raise ValueError(f"data_dir: {path} is not a raydec draft dataset (format {kind!r}, expected {DATA_FORMAT!r})")
    if not manifest.get("num_samples") or not manifest.get("shards"):
        raise ValueError(f"data_dir: the draft dataset at {data_dir} holds no samples ({manifest.get('num_samples')!r})")
    return manifest


def generate_dataset(config: DataGenConfig, image_source: ImageSource) -> dict[str, Any]:
    """Run the Ray Data job (connects to / starts Ray) and write shards + manifest. Returns the manifest.

    image_source: seeds -> their images, called in the workers (a module-level function, so
    Ray sends it by reference); the reference drafts use ``raydec.reference.shapes.sample_images``.

    An existing dataset in ``output_dir`` with the same content settings (``CONTENT_FIELDS``) and
    the same target weights is reused unless ``overwrite``; otherwise an error.
    """
    import ray

    out = Path(config.output_dir)
    check_folder(out, "data.output_dir")
    target_path = resolve_vlm_path(config.target)
    identity = content_identity(config, folder_identity(target_path))
    if (out / MANIFEST_NAME).is_file() and not config.overwrite:
        manifest = read_manifest(out)
        if {**CONTENT_DEFAULTS, **(manifest.get("identity") or {})} == identity:
            logger.info("reusing draft dataset at %s (%d samples)", out, manifest["num_samples"])
            return manifest
        raise FileExistsError(
            f"{out} holds a dataset of other settings or target weights ({manifest.get('identity')} != {identity}); "
            "set overwrite or another output_dir"
        )
    if out.exists():
        shutil.rmtree(out / SHARDS_DIR, ignore_errors=True)
        (out / MANIFEST_NAME).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    connect_ray()
    start = time.time()
    blocks = max(1, math.ceil(config.num_samples / config.batch_size))
    # in-memory seeds or CPU-free read tasks, and light write tasks: on a 1-2 CPU node the
    # actor pool must not starve the other stages of CPUs
    if config.images is not None:  # the workers reach S3 with what this driver resolves (AWS_* here)
        config = config.model_copy(update={"images": config.images.model_copy(update={"s3": config.images.s3.resolved()})})
    dataset = samples_dataset(config).map_batches(
        _TargetWorker,
        fn_constructor_args=(config.model_dump_json(), image_source if config.images is None else None),
        batch_size=config.batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=min(config.workers, blocks)),
        num_cpus=config.cpus_per_worker,
        num_gpus=config.gpus_per_worker or None,
    )
    dataset.write_parquet(str((out / SHARDS_DIR).resolve()), ray_remote_args={"num_cpus": 0.1})
    wall = time.time() - start
    manifest = summarize_shards(out)
    target_config = json.loads((target_path / "config.json").read_text())
    text_config = target_config.get("text_config", target_config)
    manifest.update(
        format=DATA_FORMAT,
        target=str(target_path.resolve()) if config.target == "reference" else config.target,
        target_model_type=target_config.get("model_type"),
        hidden_size=int(text_config["hidden_size"]),
        vocab_size=int(text_config["vocab_size"]),
        storage_dtype=config.storage_dtype,
        prompt=config.prompt,
        seeds=[config.seed_start, config.seed_start + config.num_samples] if config.images is None else None,
        images=None if config.images is None else config.images.path,
        wall_s=round(wall, 1),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        config=redact_secrets(json.loads(config.model_dump_json())),
        identity=identity,
    )
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    logger.info("draft dataset: %d samples, %d tokens (%d generated) in %.0f s -> %s",
                manifest["num_samples"], manifest["num_tokens"], manifest["num_generated_tokens"], wall, out)
    return manifest


def summarize_shards(data_dir: Path) -> dict[str, Any]:
    """Counts over the shards: samples, tokens, generated tokens, shard files."""
    import pyarrow.parquet as pq

    files = sorted((data_dir / SHARDS_DIR).glob("*.parquet"))
    samples = tokens = generated = 0
    for file in files:
        table = pq.read_table(file, columns=["length", "prompt_len"])
        length = np.asarray(table["length"].to_numpy(), dtype=np.int64)
        prompt = np.asarray(table["prompt_len"].to_numpy(), dtype=np.int64)
        samples += len(length)
        tokens += int(length.sum())
        generated += int((length - prompt).sum())
    return {
        "num_samples": samples, "num_tokens": tokens, "num_generated_tokens": generated,
        "shards": [str(f.relative_to(data_dir)) for f in files],
    }
