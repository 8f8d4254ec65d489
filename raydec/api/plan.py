"""The decode plan: the method, draft shape and batch size a call, a job, a stage or a Serve replica
decodes with, where each came from, and the key it is cached under. One function makes it.

    plan = plan_decode(decode, batch_size, calibration, recorded)   # once, before the first row decodes
    plan.decode       # concrete: its draft shape is never "auto" (the method may become "ar")
    plan.record()     # what a manifest, a result and /v1/raydec/stats keep

A decode config means the same at every entry point (``generate_images``, ``caption_images``,
``raydec generate`` / ``caption``, a job, a stage, Serve): the draft shape it names, the method's
default when it names none, and a shape tuned for the batch on the device only where it says
"auto" (``jacobi: auto``, ``draft_tree: auto``). So one seed and one decode config give one output
everywhere. A tuned choice is made once per (weights, device, dtype, threads, batch, config), cached
on disk (``raydec.api.draft_shapes.ShapeCache``) and kept in a job's manifest; a resumed job takes the
plan its manifest records (``recorded``). ``batch_size: auto`` (jobs, stages, Serve) is measured
first: the most rows whose KV cache fits the worker's memory (``raydec.api.memory``).

Every candidate shape decodes losslessly: the plan moves speed, never the output law. With sampling,
a row's particular sample depends on the shape it was decoded with under ``coupling: rejection``, and
on its seed alone under ``coupling: gumbel`` (the plan records which).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

from raydec.api.draft_shapes import ShapeCache, apply_shape, candidate_configs, key_digest, shape_record, target_shape_key
from raydec.api.tuner import ROUNDS, round_parts, round_rows, round_size, shape_label, tune_for_batch
from raydec.config import DRAFT_METHODS, JACOBI_METHODS, DecodeConfig
from raydec.speculative.capture import resolve_compile

logger = logging.getLogger(__name__)

#: where a plan's draft shape came from: the config names it, the method's default (the config
#: names none), the shape cache, measured now, or the manifest of the output a job resumes
ShapeSource = Literal["config", "default", "cache", "tuned", "manifest"]
#: where its batch size came from: the config, measured now ("auto"), or the resumed job's manifest
BatchSource = Literal["config", "measured", "manifest"]
#: how a sampled row's tokens follow from its seed (``DecodeConfig.coupling``): "rejection" (speculative
#: sampling's accept test, a draw from the residual law on rejection: a sample depends on the draft
#: shape) or "gumbel" (Gumbel-max with noise fixed per generated position: the same tokens whatever the
#: method, shape or batch)
Coupling = Literal["rejection", "gumbel"]


class Calibration(Protocol):
    """What an entry point gives ``plan_decode`` to choose what its config leaves to "auto": rows to
    decode where the rows will be decoded. Public functions calibrate on a call's own rows
    (:class:`CallCalibration`), jobs and stages on their input's first rows and Serve replicas on
    rows they make (``raydec.runtime.planning.RowsCalibration``)."""

    captured: bool  # whether the step is captured on the device (the tuner times its finalists captured)

    def available(self, batch: int) -> int:
        """How many calibration rows there are to tune a shape for ``batch`` on."""

    def key(self, decode: DecodeConfig, batch: int) -> dict | None:
        """The shape cache's key for ``decode`` at ``batch`` (None: nothing identifies the weights)."""

    def seconds(self, decode: DecodeConfig, batch: int, rows: list[int]) -> float:
        """Seconds to decode the calibration rows at ``rows`` with ``decode`` at ``batch``."""

    def measure_batch(self) -> dict:
        """``batch_size: auto``: ``{"batch_size": n, ...}`` with the figures it came from."""


@dataclass(frozen=True)
class DecodePlan:
    """What rows decode with: ``decode`` is concrete (no "auto" shape), at ``batch_size``."""

    decode: DecodeConfig
    batch_size: int
    shape_from: ShapeSource
    batch_from: BatchSource
    key: dict | None = None  # the shape cache's key (None: a shape not tuned, or weights nothing identifies)
    shape: dict = field(default_factory=dict)  # the tuning's record: label, trials' rates, seconds, calibration rows
    batch: dict = field(default_factory=dict)  # batch_size auto's record: a row's KV bytes, the memory, ...

    @property
    def coupling(self) -> Coupling:
        """How a sampled row's tokens follow from its seed: the decode config's (a request may bring its own)."""
        return self.decode.coupling

    @property
    def label(self) -> str:
        """The method and its shape, ``sjd_pac w16 k2 d1`` (plain AR: ``ar``)."""
        method = self.decode.method
        return method if method == "ar" else f"{method} {shape_label(self.decode)}"

    def record(self) -> dict[str, Any]:
        """JSON a manifest, a result and ``/v1/raydec/stats`` keep, and a resumed job reads back."""
        decode = self.decode
        return {
            "method": decode.method, "label": self.label, "batch_size": self.batch_size,
            "jacobi": decode.jacobi.model_dump() if decode.method in JACOBI_METHODS else None,
            "draft_tree": decode.tree.model_dump() if decode.method in DRAFT_METHODS else None,
            "shape_from": self.shape_from, "batch_from": self.batch_from, "coupling": self.coupling,
            "key": key_digest(self.key) if self.key is not None else None,
            **({"tuning": self.shape} if self.shape else {}), **({"batch": self.batch} if self.batch else {}),
        }


def plan_decode(
    decode: DecodeConfig,
    batch_size: int | Literal["auto"],
    calibration: Calibration | None = None,
    recorded: Mapping[str, Any] | None = None,
    cache: ShapeCache | None = None,
    rounds: int = ROUNDS,
    candidates: Sequence[DecodeConfig] | None = None,
) -> DecodePlan:
    """The plan for ``decode`` at ``batch_size``. ``recorded``: the plan a resumed job's manifest keeps
    (its batch size and shape are taken as they are). What is left to "auto" is chosen with
    ``calibration``: the batch size first (the most rows that fit, ``Calibration.measure_batch``),
    then the shape for that batch, from the shape cache, else tuned now (:func:`tune_for_batch` over
    ``candidates``, by default ``candidate_configs``, plain AR among them) and cached."""
    recorded = dict(recorded or {})
    settled = settled_plan(decode, batch_size, recorded)
    if settled is not None:
        return settled
    if calibration is None:
        raise ValueError("plan_decode: the config leaves the batch size or the draft shape to 'auto' and no calibration was given")
    batch_record: dict = {}
    if batch_size == "auto" and "batch_size" in recorded:
        batch, batch_from = int(recorded["batch_size"]), "manifest"
    elif batch_size == "auto":
        assert calibration is not None
        batch_record = calibration.measure_batch()
        batch, batch_from = int(batch_record["batch_size"]), "measured"
    else:
        batch, batch_from = int(batch_size), "config"
    if not decode.auto_shape:
        return DecodePlan(decode, batch, _named_or_default(decode), batch_from, batch=batch_record)
    if "method" in recorded:
        return DecodePlan(apply_shape(decode, recorded), batch, "manifest", batch_from, batch=batch_record)
    chosen, source, key, shape = _choose_shape(decode, batch, calibration, cache or ShapeCache(), rounds, candidates)
    return DecodePlan(chosen, batch, source, batch_from, key=key, shape=shape, batch=batch_record)


def settled_plan(decode: DecodeConfig, batch_size: int | Literal["auto"], recorded: Mapping[str, Any]) -> DecodePlan | None:
    """``plan_decode``'s plan when nothing is left to measure (the config fixes it, or ``recorded`` keeps
    what it leaves to "auto"), else None: a job's driver makes it so, and measures nothing."""
    batch_open = batch_size == "auto" and "batch_size" not in recorded
    if batch_open or (decode.auto_shape and "method" not in recorded):
        return None
    batch, batch_from = (int(recorded["batch_size"]), "manifest") if batch_size == "auto" else (int(batch_size), "config")
    if decode.auto_shape:
        return DecodePlan(apply_shape(decode, recorded), batch, "manifest", batch_from)
    return DecodePlan(decode, batch, _named_or_default(decode), batch_from)


def _named_or_default(decode: DecodeConfig) -> ShapeSource:
    """Whether a fixed shape is the config's own or the method's default (the config names none)."""
    field = "jacobi" if decode.method in JACOBI_METHODS else "draft_tree"
    return "config" if decode.method == "ar" or field in decode.model_fields_set else "default"


def _choose_shape(
    decode: DecodeConfig, batch: int, calibration: Calibration, cache: ShapeCache, rounds: int,
    candidates: Sequence[DecodeConfig] | None,
) -> tuple[DecodeConfig, ShapeSource, dict | None, dict]:
    """(the config with its "auto" shape chosen for ``batch``, where from, the cache key, the tuning record)."""
    started = time.perf_counter()
    key = calibration.key(decode, batch)
    cached = cache.get(key) if key is not None else None
    if cached is not None:
        logger.info("%s at batch %d: the shape tuned earlier on this device, %s (%s)", decode.method, batch, cached["label"], cache.folder)
        return apply_shape(decode, cached), "cache", key, {}
    rows = calibration.available(batch)
    parts, per_part = round_parts(batch, max(1, min(rows, round_size(batch))))
    candidates = list(candidates) if candidates is not None else candidate_configs(decode)
    logger.info("%s at batch %d: tuning the draft shape over %d candidates (plain AR among them) on %d calibration row(s)",
                decode.method, batch, len(candidates), per_part * parts)

    def seconds(candidate: DecodeConfig, turn: int) -> float:
        return calibration.seconds(candidate, batch, round_rows(list(range(rows)), per_part, turn))

    chosen, trials = tune_for_batch(seconds, candidates, per_part * parts, rounds, parts=parts, captured=calibration.captured)
    record = shape_record(chosen)
    if key is not None:
        cache.put(key, record, trials)
    ratio = next(t.ratio_to_ar for t in trials if t.config is chosen)
    logger.info("%s at batch %d: chose %s (%.2fx AR's rows/s on the calibration rows)", decode.method, batch, record["label"], ratio)
    tuning = {"ratio_to_ar": ratio, "calibration_rows": per_part * parts, "seconds": time.perf_counter() - started,
              "trials": [{"shape": shape_label(t.config), "rows_per_s": t.rows_per_s, "ratio_to_ar": t.ratio_to_ar, "captured": t.captured}
                         for t in trials]}
    return chosen, "tuned", key, tuning


class CallCalibration:
    """A public function's calibration: the call's own rows, decoded on its loaded target.
    ``run(config, batch, indices)`` decodes the call's rows at ``indices``."""

    def __init__(self, target: Any, rows: int, run: Callable[[DecodeConfig, int, list[int]], Any],
                 compile_mode: str, draft_folder: str | Path | None = None) -> None:
        self.target, self.rows, self.run, self.draft_folder = target, rows, run, draft_folder
        self.captured = resolve_compile(compile_mode, target.device)

    def available(self, batch: int) -> int:
        return self.rows

    def key(self, decode: DecodeConfig, batch: int) -> dict | None:
        return target_shape_key(decode, self.target, batch, self.draft_folder)

    def seconds(self, decode: DecodeConfig, batch: int, rows: list[int]) -> float:
        start = time.perf_counter()
        self.run(decode, batch, rows)
        return time.perf_counter() - start

    def measure_batch(self) -> dict:
        raise ValueError("batch_size: a public function takes a number of rows, not 'auto'")
