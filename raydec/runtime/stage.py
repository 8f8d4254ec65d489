"""``build_processor(config)``: text-to-image or captioning as a Dataset -> Dataset stage over a
user's own Ray Dataset.

    from raydec.runtime import ProcessorConfig, build_processor

    processor = build_processor(ProcessorConfig(task="t2i", model="reference", decode={"method": "sjd_pac"},
                                                concurrency=(1, 4)))
    ds = ray.data.read_parquet("s3://bucket/prompts/").map(add_style)      # the user's pipeline
    ds = processor(ds).filter(lambda row: row["error"] is None)             # adds the outputs
    ds.write_parquet("s3://bucket/images/")

Rows are validated in the workers (an empty or overlong prompt, corrupt, oversized or missing
images ... become the row's ``error``; the other rows go on). Every input column is kept; the
stage adds ``id``, ``seed`` (given, or derived from the id and ``rows.seed``), ``method``,
``image`` (PNG bytes) or ``image_uri`` (when ``images_to`` is set) for text-to-image,
``caption`` for captioning, the decoding statistics (``target_forwards``, ``tokens``,
``tokens_per_forward``, ``latency_s``) and ``error``. A row's output depends only on its
inputs, seed and config, never on its batch or worker.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Dict, List

import pyarrow as pa

from raydec.io import ResultWriter, encode_png, error_result, validate_caption_rows, validate_t2i_rows
from raydec.runtime.config import ProcessorConfig
from raydec.runtime.planning import plan_stage
from raydec.runtime.row_decoders import make_row_decoder
from raydec.runtime.worker import worker_id

logger = logging.getLogger(__name__)

OUTPUT_FIELDS = [
    pa.field("id", pa.string()),
    pa.field("seed", pa.int64()),
    pa.field("method", pa.string()),
    pa.field("image", pa.binary()),
    pa.field("image_uri", pa.string()),
    pa.field("caption", pa.string()),
    pa.field("target_forwards", pa.int64()),
    pa.field("tokens", pa.int64()),
    pa.field("tokens_per_forward", pa.float64()),
    pa.field("latency_s", pa.float64()),
    pa.field("error", pa.string()),
]
"""What the stage adds to each row (text-to-image fills image or image_uri, captioning caption)."""


def output_names(config: ProcessorConfig) -> List[str]:
    """The output columns of a stage: the task's own, without the other task's."""
    skip = {"caption"} if config.task == "t2i" else {"image", "image_uri"}
    if config.task == "t2i":
        skip.add("image_uri" if config.images_to is None else "image")
    return [f.name for f in OUTPUT_FIELDS if f.name not in skip]


class StageWorker:
    """The actor class of the stage's pool: loads the model once, then validates and decodes
    each batch of the user's rows."""

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config
        self.decoder = make_row_decoder(config)
        self.decoder.setup()
        self.writer = None
        if config.images_to is not None:
            self.writer = ResultWriter(config.images_to, worker_id=worker_id())
        self.batches = 0

    def __call__(self, batch: pa.Table) -> pa.Table:
        config, rows = self.config, batch.to_pylist()
        validate = validate_t2i_rows if config.task == "t2i" else validate_caption_rows
        self.batches += 1
        # rows without an id get "<stage batch>#<row>": unique within this call only; give your rows ids to resume by them
        checked = validate(rows, config.rows, file_key=f"batch-{id(self):x}-{self.batches}", first_row_index=0)
        good = [row for row in checked if not row["error"]]
        results = {row["id"]: error_result(row, self.decoder.method) for row in checked if row["error"]}
        if good:
            for result in self.decoder(good):
                results[result["id"]] = result
        names = output_names(config)
        columns: Dict[str, List[Any]] = {name: [] for name in names}
        for row in checked:
            result = dict(results[row["id"]])
            image = result.pop("image", None)
            if image is not None and not result.get("error"):
                if self.writer is not None:
                    result["image_uri"] = self.writer.write_image(result["id"], image)
                else:
                    result["image"] = encode_png(image)
            for name in names:
                columns[name].append(result.get(name))
        fields = {f.name: f for f in OUTPUT_FIELDS}
        table = batch
        for name in names:  # the outputs replace input columns of the same name
            array = pa.array(columns[name], type=fields[name].type)
            if name in table.column_names:
                table = table.set_column(table.column_names.index(name), fields[name], array)
            else:
                table = table.append_column(fields[name], array)
        return table


class DatasetProcessor:
    """A Dataset -> Dataset stage (see the module docstring); ``build_processor`` makes one."""

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config
        self.plan: Any = None  # the DecodePlan its actors decode with, made when it is applied to a dataset

    def __call__(self, dataset: Any) -> Any:
        import ray.data

        config, self.plan = plan_stage(self.config, dataset)  # once, for every actor
        self.config = config
        size = config.concurrency
        compute = ray.data.ActorPoolStrategy(min_size=size[0], max_size=size[1]) if isinstance(size, tuple) \
            else ray.data.ActorPoolStrategy(size=size)
        resources: Dict[str, Any] = {"num_cpus": config.cpus_per_worker}
        if config.gpus_per_worker > 0:
            resources["num_gpus"] = config.gpus_per_worker
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
            return dataset.map_batches(
                StageWorker, fn_constructor_kwargs={"config": config}, batch_size=config.batch_size,
                batch_format="pyarrow", compute=compute, **resources,
            )


def build_processor(config: ProcessorConfig | dict) -> DatasetProcessor:
    """The Dataset -> Dataset stage for ``config`` (a ProcessorConfig or a dict of its fields)."""
    if isinstance(config, dict):
        config = ProcessorConfig.model_validate(config)
    return DatasetProcessor(config)
