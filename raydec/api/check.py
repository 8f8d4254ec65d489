"""``check_identity``: that a method decodes plain AR's tokens, on your model, rows, dtype and device.

    report = check_identity(prompts, model="/models/janus-pro-7b", decode={"method": "sjd_pac"},
                            dtype=torch.bfloat16, device="cuda")
    print(report.table())      # rows identical, each difference classified, speed against AR
    report.passed              # True when every difference is a numeric near-tie

Under ``coupling: gumbel`` a row's tokens are its seed's whatever the method, shape or batch:
exactly in float64; in lower precision AR and the method compute P with different kernels, and
a token can differ where two perturbed scores tie to the last bits. Every row is decoded with
plain AR and with the method (same seeds, same batch size); for each row that differs, its first
differing position is recomputed on a higher-precision copy of the model
(``raydec.api.near_ties``) and classified: a numeric near-tie, or a decoding bug.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from raydec.api.captions import DEFAULT_CAPTION_PROMPT, caption_images, draft_folder
from raydec.api.images import generate_images
from raydec.api.inputs import as_decode_config, as_image_list, caption_decode_config, image_decode_config, max_positions, sized
from raydec.api.near_ties import TieVerdict, classify_difference, position_scores
from raydec.api.plan import CallCalibration, plan_decode
from raydec.config import DRAFT_METHODS, JACOBI_METHODS, DecodeConfig
from raydec.models.image_gen import ImagePrompt
from raydec.models.loading import load_target

logger = logging.getLogger("raydec.api")


def task_of(method: str) -> str:
    """The task a method decodes: "t2i" (sjd, sjd_ac, sjd_pac) or "caption" (vispec, eagle)."""
    if method in JACOBI_METHODS:
        return "t2i"
    if method in DRAFT_METHODS:
        return "caption"
    raise ValueError(f"decode.method={method!r}: check a speculative method against AR "
                     f"(text-to-image: {', '.join(JACOBI_METHODS)}; captions: {', '.join(DRAFT_METHODS)})")


@dataclass
class RunFigures:
    """One decode of every row: ``label`` (the method and its draft shape), wall seconds of the call
    (a text-to-image call's VQ decoding included, the same for both runs), target forwards and tokens."""

    label: str
    seconds: float
    target_forwards: int
    tokens: int

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / max(1, self.target_forwards)

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "seconds": self.seconds, "target_forwards": self.target_forwards, "tokens": self.tokens,
                "tokens_per_forward": self.tokens_per_forward}


@dataclass
class RowCheck:
    """One row: whether the method's tokens are AR's; where they are not, the first differing
    position's verdict (None with ``identical`` False: one decode ended where the other went on)."""

    row_id: str
    seed: int
    identical: bool
    ar_length: int
    method_length: int
    verdict: TieVerdict | None = None

    @property
    def near_tie(self) -> bool:
        return self.verdict is not None and self.verdict.near_tie

    @property
    def bug(self) -> bool:
        return not self.identical and not self.near_tie

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.row_id, "seed": self.seed, "identical": self.identical, "ar_length": self.ar_length,
                "method_length": self.method_length, "difference": self.verdict.as_dict() if self.verdict else None}


@dataclass
class CheckReport:
    """What ``check_identity`` found: every row, and speed from the same run."""

    task: str
    method: str
    dtype: str
    device: str
    coupling: str
    rows: list[RowCheck]
    ar: RunFigures
    speculative: RunFigures
    sampling: dict[str, Any] = field(default_factory=dict)

    @property
    def identical_rows(self) -> int:
        return sum(row.identical for row in self.rows)

    @property
    def near_ties(self) -> int:
        return sum(row.near_tie for row in self.rows)

    @property
    def bugs(self) -> list[RowCheck]:
        """The rows whose difference is not a numeric near-tie."""
        return [row for row in self.rows if row.bug]

    @property
    def passed(self) -> bool:
        return not self.bugs

    @property
    def speedup(self) -> float:
        """AR's seconds over the method's."""
        return self.ar.seconds / max(self.speculative.seconds, 1e-9)

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "method": self.method, "dtype": self.dtype, "device": self.device, "coupling": self.coupling,
                "sampling": self.sampling, "rows": len(self.rows), "identical_rows": self.identical_rows,
                "near_ties": self.near_ties, "not_near_ties": len(self.bugs), "passed": self.passed,
                "ar": self.ar.as_dict(), "method_run": self.speculative.as_dict(), "speedup": self.speedup,
                "row_checks": [row.as_dict() for row in self.rows]}

    def table(self) -> str:
        """One screen: the counts, each differing row, the speed."""
        lines = [f"{self.speculative.label} against AR ({self.task}), {self.dtype} on {self.device}, {len(self.rows)} rows, "
                 f"coupling {self.coupling}",
                 f"rows identical: {self.identical_rows}/{len(self.rows)}; near-ties: {self.near_ties}; not near-ties: {len(self.bugs)}"]
        differing = [row for row in self.rows if not row.identical]
        if differing:
            lines.append(f"  {'row':>8} {'seed':>6} {'position':>8} {'AR':>7} {'method':>7} {'gap':>9} {'tolerance':>9} "
                         f"{'reference':>9}  verdict")
        for row in differing:
            v = row.verdict
            if v is None:
                lines.append(f"  {row.row_id:>8} {row.seed:>6} {min(row.ar_length, row.method_length):>8} "
                             f"(AR {row.ar_length} tokens, the method {row.method_length})  NOT a near-tie")
                continue
            lines.append(f"  {row.row_id:>8} {row.seed:>6} {v.position:>8} {v.ar_token:>7} {v.method_token:>7} {v.gap:>9.2e} "
                         f"{v.tolerance:>9.2e} {v.reference_token:>9}  {'near-tie' if v.near_tie else 'NOT a near-tie'}"
                         f" ({v.reference_dtype} forward)")
        lines.append(f"speed: AR {self.ar.tokens_per_forward:.2f} tokens per target forward, {self.ar.seconds:.2f} s; "
                     f"{self.speculative.label} {self.speculative.tokens_per_forward:.2f}, {self.speculative.seconds:.2f} s "
                     f"({self.speedup:.2f}x AR)")
        return "\n".join(lines)


def check_identity(
    rows: Sequence[Any],
    model: str | Path | Any = "reference",
    decode: DecodeConfig | dict | None = None,
    seeds: Sequence[int] | None = None,
    batch_size: int = 8,
    dtype: torch.dtype = torch.float32,
    device: str | None = None,
    prompt: str | Sequence[str] = DEFAULT_CAPTION_PROMPT,
    size: str | None = None,
    reference_dtype: torch.dtype | None = None,
    ids: Sequence[str] | None = None,
    warmup: bool = True,
    progress: bool = False,
) -> CheckReport:
    """Decode ``rows`` with plain AR and with ``decode.method`` (same seeds and batch size, coupling
    gumbel) and check that every row's tokens are AR's, or differ only at a numeric near-tie.

    rows: prompts (a text-to-image method: sjd, sjd_ac, sjd_pac) or images (a caption method:
    vispec, eagle; ``prompt`` is the question, one or one per row). model: "reference", a
    checkpoint folder (loaded in ``dtype`` on ``device``) or a target from ``load_target``.
    decode: the method, its draft shape (``auto`` is tuned first, untimed) and sampling, as for
    ``generate_images`` / ``caption_images`` (default: sjd_pac). reference_dtype: the precision a
    differing position is recomputed in (default: float64 for float32 and float64 targets,
    float32 for 16-bit ones). warmup: decode the first row with each config first, untimed.
    ``coupling: rejection`` is a ValueError: a seed's tokens then depend on the drafts.
    """
    config = as_decode_config(decode) or DecodeConfig(method="sjd_pac")
    if config.coupling != "gumbel":
        raise ValueError(f"coupling: {config.coupling} has no row identity to check (a seed's tokens depend on the method and "
                         "draft shape); check with coupling: gumbel")
    task = task_of(config.method)
    if isinstance(rows, (str, bytes)):
        raise TypeError("rows must be a list (one prompt or image per row)")
    count = len(rows)
    seeds = list(seeds) if seeds is not None else list(range(count))
    ids = [str(i) for i in ids] if ids is not None else [str(i) for i in range(count)]
    if len(seeds) != count or len(ids) != count:
        raise ValueError(f"seeds ({len(seeds)}) and ids ({len(ids)}) must have one entry per row ({count})")
    if task == "caption":  # read before the model loads: a bad image is the row's error, named
        rows = [as_image_list(row, index) for index, row in enumerate(rows)]
    target = load_target(model, task=task, dtype=dtype, device=device)
    if task == "t2i":
        target = sized(target, size)
    questions = [prompt] * count if isinstance(prompt, str) else list(prompt)
    if len(questions) != count:
        raise ValueError(f"prompt has {len(questions)} entries but rows has {count}")

    def run(candidate: DecodeConfig, picked: Sequence[int], batch: int, show: bool = False) -> list[Any]:
        if task == "t2i":
            return generate_images([rows[i] for i in picked], model=target, decode=candidate, seeds=[seeds[i] for i in picked],
                                   batch_size=batch, progress=show)
        return caption_images([rows[i] for i in picked], prompt=[questions[i] for i in picked], model=target, decode=candidate,
                              seeds=[seeds[i] for i in picked], batch_size=batch, progress=show)

    resolved = image_decode_config(config, target) if task == "t2i" else caption_decode_config(config, target)
    if resolved.auto_shape:
        calibration = CallCalibration(target, count, lambda c, b, picked: run(c, picked, b), resolved.compile,
                                      draft_folder(model, target, resolved))
        resolved = plan_decode(resolved, batch_size, calibration).decode
    ar_config = resolved.model_copy(update={"method": "ar"})
    if warmup and count:
        for candidate in (ar_config, resolved):
            run(candidate, [0], 1)
    everything = list(range(count))
    logger.info("raydec check: plain AR on %d rows", count)
    ar_results, ar_run = _timed(lambda: run(ar_config, everything, batch_size, progress))
    logger.info("raydec check: %s on %d rows", resolved.method, count)
    method_results, method_run = _timed(lambda: run(resolved, everything, batch_size, progress))
    checks = _row_checks(ids, seeds, ar_results, method_results,
                         lambda: _reference_target(model, target, task, size, reference_dtype),
                         lambda ref, index, ar_tokens, method_tokens, position: _verdict(
                             ref, task, resolved, _row_prompt(task, ref, rows[index], questions[index]), seeds[index], ar_tokens,
                             method_tokens, position, target.dtype))
    return CheckReport(task, resolved.method, str(target.dtype).replace("torch.", ""), str(target.device), resolved.coupling, checks,
                       ar_run, method_run, resolved.sampling.model_dump())


def _row_checks(ids: Sequence[str], seeds: Sequence[int], ar_results: Sequence[Any], method_results: Sequence[Any],
                load_reference: Callable[[], Any], verdict: Callable[..., TieVerdict]) -> list[RowCheck]:
    """Each row's check; the reference model is loaded for the first row that differs."""
    checks = []
    reference: list[Any] = []
    for index, (ar_row, method_row) in enumerate(zip(ar_results, method_results)):
        check = RowCheck(ids[index], seeds[index], ar_row.tokens == method_row.tokens, len(ar_row.tokens), len(method_row.tokens))
        position = _first_difference(ar_row.tokens, method_row.tokens)
        if position is not None and position < min(len(ar_row.tokens), len(method_row.tokens)):
            logger.info("raydec check: row %s differs at position %d: recomputing it", ids[index], position)
            reference = reference or [load_reference()]
            check.verdict = verdict(reference[0], index, ar_row.tokens, method_row.tokens, position)
        checks.append(check)
    return checks


def _timed(decode_all: Callable[[], list[Any]]) -> tuple[list[Any], RunFigures]:
    """Decode every row; the results and their figures (labelled by the plan the rows report)."""
    start = time.perf_counter()
    results = decode_all()
    seconds = time.perf_counter() - start
    labels = sorted({result.plan for result in results})
    return results, RunFigures(", ".join(labels), seconds, sum(r.target_forwards for r in results), sum(r.num_tokens for r in results))


def _first_difference(ar_tokens: Sequence[int], method_tokens: Sequence[int]) -> int | None:
    """The first position where the two differ (the shorter's length when one is the other's prefix), or None."""
    for position, (a, b) in enumerate(zip(ar_tokens, method_tokens)):
        if a != b:
            return position
    return None if len(ar_tokens) == len(method_tokens) else min(len(ar_tokens), len(method_tokens))


def _reference_target(model: Any, target: Any, task: str, size: str | None, reference_dtype: torch.dtype | None) -> Any:
    """The model in the reference precision (the checked target itself when it has that dtype)."""
    dtype = reference_dtype or (torch.float64 if target.dtype in (torch.float32, torch.float64) else torch.float32)
    if dtype == target.dtype:
        return target
    source = model if isinstance(model, (str, Path)) else (getattr(target, "checkpoint_path", None) or target.model.name_or_path)
    if not source:
        raise ValueError(f"reference_dtype: the target was not loaded from a folder, so it cannot be loaded again in {dtype}; "
                         "pass the model's path, or reference_dtype equal to its dtype")
    device = str(target.device) if torch.device(target.device).type != "cpu" else None
    logger.info("raydec check: loading %s in %s to recompute differing positions", source, str(dtype).replace("torch.", ""))
    loaded = load_target(source, task=task, dtype=dtype, device=device)
    return sized(loaded, size) if task == "t2i" else loaded


def _verdict(reference: Any, task: str, config: DecodeConfig, prompt: Any, seed: int, ar_tokens: Sequence[int],
             method_tokens: Sequence[int], position: int, dtype: torch.dtype) -> TieVerdict:
    """The first differing ``position`` of a row, recomputed on ``reference`` and classified for ``dtype``."""
    scores = position_scores(reference, config.sampling, prompt, seed, ar_tokens[:position],
                             constraint=reference.vocab_constraint() if task == "t2i" else None,
                             max_positions=max_positions(reference) if task == "caption" else None)
    return classify_difference(scores, position, ar_tokens[position], method_tokens[position], dtype, reference.dtype)


def _row_prompt(task: str, target: Any, row: Any, question: str) -> Any:
    """The engine's prompt of one row, as ``generate_images`` / ``caption_images`` build it."""
    if task == "t2i":
        return ImagePrompt(row, None)
    from raydec.models.hf_vlm import VlmPrompt  # lazy, as in caption_images

    return VlmPrompt(target.format_prompt(question, len(row)), row)
