"""A replica's "auto" batch size and draft shape, settled when it starts, before it takes a request.

    served, choice = settle_auto(served)   # in the replica's constructor, where its model runs

The replica measures on calibration rows it makes itself (``raydec.runtime.calibration``: a few
generic prompts, or a few generated pictures), with the functions a batch job uses in its tuning
task (``raydec.runtime.shapes``): the batch size first (``batch_size: auto``, the most rows whose KV
cache fits ``max_memory_fraction`` of the replica's memory), then the draft shape for that batch: the
one the shape cache holds for the same weights, device, dtype, batch and config (the key a job uses,
so a job's choice serves a replica and the other way round), else tuned now and written to the
cache, so the next replica on the node starts without tuning.
"""

from __future__ import annotations

from typing import Any

from raydec.serve.config import ServedModel


def processor_config(served: ServedModel) -> Any:
    """The stage config a job with ``served``'s model, decoding and worker would run (what the tuning
    functions and the shape cache's key take)."""
    from raydec.runtime.config import ProcessorConfig

    return ProcessorConfig(
        task=served.task, model=served.model, dtype=served.dtype, decode=served.decode, batch_size=served.batch_size,
        vqgan_path=served.vqgan_path,
        max_memory_fraction=served.max_memory_fraction, cpus_per_worker=served.cpus_per_worker,
        gpus_per_worker=min(1.0, served.gpus_per_worker), torch_threads=served.torch_threads,
    )


def settle_auto(served: ServedModel) -> tuple[ServedModel, dict[str, Any]]:
    """``served`` with a concrete batch size and draft shape, and what was chosen:
    ``{"batch_size": record}`` (``raydec.runtime.shapes.choose_batch_on_rows``) when its batch size was
    "auto", ``{"shape": record}`` (``tune_on_rows``; ``tuned`` says whether it was measured now) when
    its shape was."""
    if not (served.decode.auto_shape or served.batch_size == "auto"):
        return served, {}
    from raydec.api.frontier import apply_shape
    from raydec.api.tuner import CALIBRATION_ROWS, calibration_pool_size, round_size
    from raydec.runtime.calibration import builtin_calibration_rows
    from raydec.runtime.shapes import choose_batch_on_rows, tune_on_rows

    config, chosen = processor_config(served), {}
    if config.batch_size == "auto":
        chosen["batch_size"] = choose_batch_on_rows(config, builtin_calibration_rows(config.task, CALIBRATION_ROWS, config.rows))
        config = config.model_copy(update={"batch_size": chosen["batch_size"]["batch_size"]})
    decode = served.decode
    if decode.auto_shape:
        rows = builtin_calibration_rows(config.task, calibration_pool_size(round_size(config.batch_size)), config.rows)
        chosen["shape"] = tune_on_rows(config, rows)
        decode = apply_shape(decode, chosen["shape"])
    return served.model_copy(update={"batch_size": config.batch_size, "decode": decode}), chosen


def describe(served: ServedModel, chosen: dict[str, Any]) -> str:
    """One line: the batch size and draft shape a replica decodes with, and where each came from."""
    from raydec.api.tuner import shape_label

    batch, shape = chosen.get("batch_size"), chosen.get("shape")
    batch_text = f"batch_size {served.batch_size}" + (
        f" (auto: a row's KV cache {batch['kv_bytes_per_row'] / 2**20:.1f} MiB, {100 * batch['max_memory_fraction']:.0f}% of "
        f"{batch['memory_bytes'] / 2**30:.2f} GiB)" if batch else "")
    method, label = served.decode.method, shape_label(served.decode)
    decoding = method if method == "ar" else f"{method} {label}"  # plain AR has no shape
    if shape is None:
        return f"{batch_text}, {decoding}"
    how = f"tuned at start in {shape['seconds']:.0f} s and cached" if shape["tuned"] else "from the shape cache"
    return f"{batch_text}, {decoding} (auto: {how})"
