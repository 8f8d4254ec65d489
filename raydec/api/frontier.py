"""The draft shape for a batch size, with plain AR among the candidates.

Speculation trades a wider forward for fewer of them. At batch 1 the wider forward is nearly
free; as the batch grows each forward already fills the device, a draft window multiplies its
work, and the trade stops paying, first for wide shapes, then for all. So the shape is chosen
for the batch it will decode, by measuring, and "no speculation" is a candidate:

    for each of the rounds (its own calibration rows, decoded in parts of about one batch each):
        for each part: every candidate decodes the part, the order rotated part by part
        seconds(c) = wall seconds config c took over the round's parts, at the batch
        ratio(c)   = seconds(ar) / seconds(c)            AR decoded in the same round
        after the first: only AR, the leaders (half the shapes, at least two) and the next
        shapes (two at most) whose ratio is at least KEEP_WITHIN (0.9) times the best shape's go on
    while the runner-up's median ratio (AR's is 1) is within CLOSE (5%) of the leader's, at most
    EXTRA_ROUNDS (2) times:
        one more round, on rows of its own, timing AR and the contenders only (the candidates
        within CLOSE of the leader's median ratio, the leader included, at most 3 besides AR)
    chosen = argmax of median ratio(c) over the candidates of the last round, AR (ratio 1)
             included; a tie keeps the earlier candidate, so AR wins a tie
    captured steps (compile on, a GPU's default): the rounds above time every candidate eagerly;
        then AR and the FINALISTS (2) best shapes are compiled on one untimed part each and timed
        captured for CAPTURED_ROUNDS (2) rounds, and the choice is made among them alone

Timing every candidate against AR in the same round keeps the choice stable on a busy machine:
a slow spell slows a round alike and its ratios hold; the median drops a round a spell split.
Taking turns part by part within a round does the same for spells shorter than a round: a
machine whose speed drifts by a fifth within a minute slows the candidates' parts alike.
One round is one draw of rows, so the first cut keeps a shape nearly level with the leaders for
the next rounds. Where the leaders lie within a few percent after the rounds, the extra rounds
time those few again on further rows; a clear lead costs nothing more. Only the candidates of the
last round are chosen among: each of them was timed in every round, while one dropped earlier
has fewer samples, and a median over fewer rows does not compare with theirs.
Compiling a captured step takes seconds to a minute per shape, so the tuner compiles the finalists
only: screening eagerly keeps tuning's time that of an eager tuning plus three compiles. The eager
step costs a fixed number of operator launches per step whatever the window (the Jacobi methods
launch the same operators for window 8 and 48, a draft tree the same per level), so capture takes
about the same time off every speculative shape's step and keeps their order; it takes a larger
share off AR's, whose step does the least besides the forward, which is why AR is timed captured
against the finalists before the choice.
Each round decodes other rows (``round_rows``): how far a draft gets depends on the row (a plain
background is guessed far ahead, a noisy one hardly), and a batch decodes as long as its slowest
row, so one set of a few rows can favour a shape that the job's rows do not.
The measure is throughput (rows per second at the batch), which is what a batch job buys; a
latency-bound caller at batch 1 gets the same answer, since one row's latency is its
throughput. Every candidate decodes losslessly: the choice moves speed, never the output law,
though with sampling a row's particular sample depends on the shape it was decoded with: so a
choice is made once per (model weights, device, dtype, threads, batch, config), cached on disk
(:class:`ShapeCache`) and recorded in a job's manifest, and a resumed job reuses it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from raydec.config import (
    DRAFT_METHODS, JACOBI_METHODS, DecodeConfig, DraftTreeConfig, JacobiDraftConfig, full_tree_nodes,
)
from raydec.speculative.capture import resolve_compile

logger = logging.getLogger(__name__)

WINDOWS: tuple[int, ...] = (8, 16, 32, 48)  # SJD windows tried (L - 1)
PAC_TREES: tuple[tuple[int, int], ...] = ((1, 0), (3, 1))  # (K, D - 1) for sjd_pac: a chain and the default tree
DRAFT_TREES: tuple[tuple[int, int, int], ...] = ((3, 2, 6), (6, 2, 12), (6, 3, 20), (8, 4, 32))  # (depth, top_k, total_tokens)
AUTO_INITS: tuple[str, ...] = ("uniform", "left")  # fresh-draft priors tried when the whole draft is "auto"
ROUNDS = 3
EXTRA_ROUNDS = 2  # rounds more at most, for a close call between the leaders
KEEP_WITHIN = 0.9  # the first cut keeps every candidate with this share of the best round-1 ratio at least
KEEP_MORE = 2  # ... and at most this many of them besides the top half (the tuning cost stays bounded)
CLOSE = 0.05  # a median ratio at least (1 - CLOSE) times the leader's is within CLOSE of it: a close call
CONTENDERS = 3  # candidates besides AR timed in an extra round, the leader included
CALIBRATION_ROWS = 8  # calibration rows per round at least; a batch size above it calibrates on that many
FINALISTS = 2  # shapes besides AR timed captured, when the step is captured
CAPTURED_ROUNDS = 2  # rounds that time AR and the finalists captured

Row = TypeVar("Row")


@dataclass(frozen=True)
class ShapeTrial:
    """One candidate and what it measured: rows per second, and its median ratio to AR's in the same
    rounds (captured: timed with its step captured, else eagerly)."""

    config: DecodeConfig
    rows_per_s: float
    ratio_to_ar: float
    captured: bool = False


def shape_label(config: DecodeConfig) -> str:
    """A short name of a config's draft shape: ``ar``, ``window=16``, ``window=16,K=3,D=1``, ``tree=6x2/12``."""
    if config.method == "ar":
        return "ar"
    if config.method in JACOBI_METHODS:
        draft = config.jacobi
        tree = f",K={draft.branching},D={draft.tree_depth}" if draft.branching > 1 and draft.tree_depth > 0 else ""
        return f"window={draft.window}{tree},init={draft.init}"
    tree = config.tree
    return f"tree={tree.depth}x{tree.top_k}/{tree.total_tokens}"


def candidate_configs(
    base: DecodeConfig,
    windows: Sequence[int] = WINDOWS,
    pac_trees: Sequence[tuple[int, int]] = PAC_TREES,
    draft_trees: Sequence[tuple[int, int, int]] = DRAFT_TREES,
) -> list[DecodeConfig]:
    """Plain AR, then every shape of ``base.method`` worth trying (its prior, sampling and draft kept)."""
    ar = base.model_copy(update={"method": "ar", "jacobi": JacobiDraftConfig(), "draft_tree": None})
    if base.method == "ar":
        return [ar]
    shapes: list[DecodeConfig] = []
    if base.method in JACOBI_METHODS:
        trees = pac_trees if base.method == "sjd_pac" else [(1, 0)]
        template = JacobiDraftConfig() if base.jacobi == "auto" else base.jacobi
        inits = AUTO_INITS if base.jacobi == "auto" else (template.init,)
        for init, window, (branching, depth) in itertools.product(inits, windows, trees):
            if branching > 1 and full_tree_nodes(branching, depth) >= window:
                continue  # the tree does not fit the window
            draft = JacobiDraftConfig(**{**template.model_dump(), "window": window, "branching": branching, "tree_depth": depth, "init": init})
            shapes.append(base.model_copy(update={"jacobi": draft}))
    elif base.method in DRAFT_METHODS:
        for depth, top_k, total in draft_trees:
            shapes.append(base.model_copy(update={"draft_tree": DraftTreeConfig(depth=depth, top_k=top_k, total_tokens=total)}))
    else:
        raise ValueError(f"method={base.method!r}: no draft shape to choose")
    return [ar, *shapes]


def round_rows(pool: Sequence[Row], count: int, turn: int) -> list[Row]:
    """The calibration rows of tuning round ``turn``: the next ``count`` rows of ``pool`` (at most
    all of it), cycling through it when it holds fewer than the rounds need."""
    count = min(count, len(pool))
    return [pool[(turn * count + i) % len(pool)] for i in range(count)]


def round_size(batch: int) -> int:
    """Calibration rows each tuning round decodes at ``batch``: the batch, and CALIBRATION_ROWS at least."""
    return max(batch, CALIBRATION_ROWS)


def round_parts(batch: int, rows: int) -> tuple[int, int]:
    """How a tuning round of ``rows`` calibration rows at ``batch`` is decoded: (parts, rows per
    part), one batch a part (a round of one batch or less is one part)."""
    parts = max(1, rows // max(1, batch))
    return parts, rows // parts


def calibration_pool_size(rows: int, rounds: int = ROUNDS) -> int:
    """Calibration rows to gather for ``rows`` per round: a fresh set for every round, the extra
    rounds of a close call included (:func:`tune_for_batch`)."""
    return rows * (rounds + EXTRA_ROUNDS)


def _time_round(
    decode_seconds: Callable[[DecodeConfig, int], float],
    candidates: Sequence[DecodeConfig],
    field: list[int],
    turn: int,
    parts: int,
    seconds: list[list[float]],
    ratios: list[list[float]],
) -> None:
    """Decode round ``turn``'s rows with every candidate in ``field`` (AR, index 0, first in it), in
    ``parts`` parts (part p of round r is ``decode_seconds``'s turn r * parts + p): every candidate
    decodes a part before the next part starts, the order rotated part by part. Append each one's
    seconds over the round and its ratio to AR's in this round."""
    total = dict.fromkeys(field, 0.0)
    for part in range(turn * parts, (turn + 1) * parts):
        shift = part % len(field)
        for index in field[shift:] + field[:shift]:
            total[index] += decode_seconds(candidates[index], part)
    for index in field:
        seconds[index].append(total[index])
        ratios[index].append(total[0] / total[index])


def _first_cut(field: list[int], ratios: list[list[float]]) -> list[int]:
    """Who goes on after round 1: AR, the top half of the other candidates (at least two), and the
    next ones (KEEP_MORE at most) whose ratio is at least KEEP_WITHIN times the best of them (AR's 1
    not counted: the cut is among the shapes)."""
    shapes = sorted(field[1:], key=lambda i: -ratios[i][0])  # stable: a tie keeps the earlier first
    if not shapes:
        return [0]
    top = max(2, -(-len(shapes) // 2))
    bar = KEEP_WITHIN * ratios[shapes[0]][0]
    return [0, *sorted(shapes[:top] + [i for i in shapes[top:] if ratios[i][0] >= bar][:KEEP_MORE])]


def _ranked(field: list[int], ratios: list[list[float]]) -> list[int]:
    """``field`` by median ratio, the best first; a tie keeps the earlier candidate first (AR first of all)."""
    return sorted(field, key=lambda i: (-statistics.median(ratios[i]), i))


def _contenders(field: list[int], ratios: list[list[float]]) -> list[int]:
    """A close call in ``field``: AR and the candidates whose median ratio is within CLOSE of the
    leader's (the leader included, at most CONTENDERS besides AR); empty when no other candidate,
    AR included, is within CLOSE of the leader."""
    ranked = _ranked(field, ratios)
    bar = (1 - CLOSE) * statistics.median(ratios[ranked[0]])
    close = [i for i in ranked if statistics.median(ratios[i]) >= bar]
    if len(close) < 2:
        return []
    return [0, *sorted([i for i in close if i != 0][:CONTENDERS])]


def tune_for_batch(
    decode_seconds: Callable[[DecodeConfig, int], float],
    candidates: Sequence[DecodeConfig],
    rows: int,
    rounds: int = ROUNDS,
    extra_rounds: int = EXTRA_ROUNDS,
    parts: int = 1,
    captured: bool = False,
) -> tuple[DecodeConfig, list[ShapeTrial]]:
    """The candidate with the best median throughput ratio to AR, and every trial.

    decode_seconds(config, turn): decode calibration part ``turn`` (``rows // parts`` rows, at the
    batch being tuned for; :func:`round_rows`) with ``config`` and return the wall seconds; round r
    is the parts ``r * parts`` to ``(r + 1) * parts - 1``, so ``turn`` counts from 0 up to
    ``(rounds + extra_rounds) * parts - 1`` at most (:func:`calibration_pool_size`; the captured
    rounds decode the first rounds' rows again). rows: the calibration rows of one round. parts: how
    many parts a round is decoded in, the candidates taking turns part by part (:func:`round_parts`;
    1: a part is a round). candidates: AR first (see :func:`candidate_configs`). Ties keep the
    earlier candidate, so AR wins a tie. extra_rounds: the most rounds run after ``rounds`` for a
    close call. captured: whether the candidates' step is captured (``resolve_compile``): they are
    screened eagerly (``compile: off``) and AR with the FINALISTS is timed captured (module docstring).
    """
    if not candidates or candidates[0].method != "ar":
        raise ValueError("candidates: plain AR must come first (it is the baseline every round is timed against)")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    screened = [c.model_copy(update={"compile": "off"}) for c in candidates] if captured else list(candidates)
    seconds: list[list[float]] = [[] for _ in candidates]
    ratios: list[list[float]] = [[] for _ in candidates]
    # invariant: every candidate in `field` was timed in every round run so far (AR always is)
    field = list(range(len(candidates)))
    for turn in range(rounds):
        _time_round(decode_seconds, screened, field, turn, parts, seconds, ratios)
        if turn == 0:  # the one cut: the later regular rounds time every survivor
            field = _first_cut(field, ratios)
    for extra in range(extra_rounds):
        contenders = _contenders(field, ratios)
        if not contenders:
            break  # the leader is clear
        logger.info("tune extra round %d of at most %d (a close call): %s", extra + 1, extra_rounds,
                    ", ".join(f"{shape_label(candidates[i])} {statistics.median(ratios[i]):.3f}x AR" for i in contenders))
        _time_round(decode_seconds, screened, contenders, rounds + extra, parts, seconds, ratios)  # rows of its own
        field = contenders  # a subset of the field: the invariant holds
    final = set()
    if captured:
        field = _time_captured(decode_seconds, candidates, _ranked(field, ratios), parts, seconds, ratios)
        final = set(field)
    trials = []
    for index, (config, samples, ratio) in enumerate(zip(candidates, seconds, ratios)):
        trials.append(ShapeTrial(config, rows / statistics.median(samples), statistics.median(ratio), index in final))
        logger.info("tune %s %s: %.2f rows/s, %.2fx AR (%d rounds%s)", config.method, shape_label(config), trials[-1].rows_per_s,
                    trials[-1].ratio_to_ar, len(samples), ", captured" if index in final else "")
    # the field holds only candidates with a sample of every round: one dropped earlier, with fewer
    # samples (rows the others were not timed on), cannot win on a median of other rows
    best = _ranked(field, ratios)[0]
    return candidates[best], trials


def _time_captured(
    decode_seconds: Callable[[DecodeConfig, int], float],
    candidates: Sequence[DecodeConfig],
    ranked: list[int],
    parts: int,
    seconds: list[list[float]],
    ratios: list[list[float]],
) -> list[int]:
    """AR and the FINALISTS best of ``ranked`` (the eager ranking), compiled on one untimed part
    each, then timed captured for CAPTURED_ROUNDS rounds (on the first rounds' rows). Their eager
    samples are replaced by the captured ones. Returns them, AR first."""
    finalists = [0, *[i for i in ranked if i != 0][:FINALISTS]]
    logger.info("tune captured: compiling and timing %s", ", ".join(shape_label(candidates[i]) for i in finalists))
    for index in finalists:  # the first decode of a shape compiles its variants: untimed
        decode_seconds(candidates[index], 0)
    for index in finalists:
        seconds[index], ratios[index] = [], []
    for turn in range(CAPTURED_ROUNDS):
        _time_round(decode_seconds, candidates, finalists, turn, parts, seconds, ratios)
    return finalists


# -- the choice, once per model, device and batch ------------------------------------------------


def shape_record(config: DecodeConfig) -> dict:
    """What a tuned choice records (a manifest's ``shape``, a cache entry): the method it decodes
    with ("ar" when speculation did not pay) and its concrete draft or tree."""
    return {
        "method": config.method,
        "jacobi": config.jacobi.model_dump() if config.method in JACOBI_METHODS else None,
        "draft_tree": config.tree.model_dump() if config.method in DRAFT_METHODS else None,
        "label": shape_label(config),
    }


def apply_shape(base: DecodeConfig, record: dict) -> DecodeConfig:
    """``base`` decoding with a recorded choice (its method may become "ar"). A record of an earlier
    release names the Jacobi shape ``draft``."""
    jacobi = record.get("jacobi") or record.get("draft")
    return base.model_copy(update={
        "method": record["method"],
        "jacobi": JacobiDraftConfig.model_validate(jacobi) if jacobi else JacobiDraftConfig(),
        "draft_tree": DraftTreeConfig.model_validate(record["draft_tree"]) if record.get("draft_tree") else None,
    })


def device_name(device: Any) -> str:
    """The device a timing belongs to: the GPU's name, or the CPU's model and torch's thread count."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu {model} x{torch.get_num_threads()} threads"


def cache_folder() -> Path:
    """Where tuned shapes are kept: ``$RAYDEC_CACHE_DIR/shapes``, else ``~/.cache/raydec/shapes``."""
    root = os.environ.get("RAYDEC_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "raydec") / "shapes"


class ShapeCache:
    """Tuned shapes on disk, one JSON file per key (the key's hash names it; the key is kept inside)."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else cache_folder()

    def _path(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
        return self.folder / f"{digest}.json"

    def get(self, key: dict) -> dict | None:
        try:
            entry = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        return entry.get("shape") if entry.get("key") == json.loads(json.dumps(key, default=str)) else None

    def put(self, key: dict, record: dict, trials: Sequence[ShapeTrial] = ()) -> Path | None:
        """Keep ``record`` under ``key`` (written whole, then renamed); an unwritable folder only logs."""
        path = self._path(key)
        entry = {"key": key, "shape": record,
                 "trials": [{"shape": shape_label(t.config), "rows_per_s": t.rows_per_s, "ratio_to_ar": t.ratio_to_ar, "captured": t.captured}
                            for t in trials]}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(entry, indent=2, default=str))
            partial.replace(path)
        except OSError as exc:
            logger.warning("shape cache %s is not writable (%s): the next run tunes again", self.folder, exc)
            return None
        return path

    def best_batch(self, key: dict) -> int | None:
        """Of the batches tuned for ``key`` at any batch size (the same weights, device, dtype and
        config), the one whose choice decoded the most rows per second; None when none was tuned."""
        wanted = {k: v for k, v in json.loads(json.dumps(key, default=str)).items() if k != "batch"}
        best: tuple[float, int] | None = None
        for path in sorted(self.folder.glob("*.json")):
            try:
                entry = json.loads(path.read_text())
                other = entry["key"]
                if {k: v for k, v in other.items() if k != "batch"} != wanted:
                    continue
                label = entry["shape"]["label"]
                rate = max(float(t["rows_per_s"]) for t in entry.get("trials", []) if t.get("shape") == label)
                batch = int(other["batch"])
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # unreadable, another key, or no timing of its choice
            if best is None or (rate, -batch) > (best[0], -best[1]):
                best = (rate, batch)
        return None if best is None else best[1]


def shape_key(base: DecodeConfig, weights: str, device: str, dtype: str, batch: int) -> dict:
    """What a tuned choice depends on: the weights, the device, the dtype, the batch and the rest of the
    config (its length included: an image size's layout, a caption's cap)."""
    config = base.model_dump(mode="json", exclude={"jacobi", "draft_tree"})
    return {"weights": weights, "device": device, "dtype": dtype, "batch": batch, "config": config}


def resolve_shape(
    base: DecodeConfig,
    batch: int,
    decode_seconds: Callable[[DecodeConfig, int], float],
    rows: int,
    key: dict | None,
    cache: ShapeCache | None = None,
    rounds: int = ROUNDS,
    parts: int = 1,
    captured: bool = False,
) -> tuple[DecodeConfig, dict]:
    """``base`` with its "auto" shape replaced by the choice for ``batch``: the cached one for
    ``key`` when there is one, else tuned now (:func:`tune_for_batch` over
    :func:`candidate_configs`) and cached. ``key`` None: nothing identifies the weights; tune
    without caching. Returns the config and its record (:func:`shape_record`, with ``tuned``:
    whether this call measured it). rows, parts: a round's calibration rows and the parts it is
    decoded in; captured: whether the step is captured on the device (:func:`tune_for_batch`)."""
    if not base.auto_shape:
        return base, {**shape_record(base), "tuned": False}
    cache = cache or ShapeCache()
    cached = cache.get(key) if key is not None else None
    if cached is not None:
        logger.info("%s at batch %d: the shape tuned earlier on this device, %s (%s)", base.method, batch, cached["label"], cache.folder)
        return apply_shape(base, cached), {**cached, "tuned": False}
    candidates = candidate_configs(base)
    logger.info("%s at batch %d: tuning the draft shape over %d candidates (plain AR among them) on %d calibration row(s)",
                base.method, batch, len(candidates), rows)
    chosen, trials = tune_for_batch(decode_seconds, candidates, rows, rounds, parts=parts, captured=captured)
    record = shape_record(chosen)
    if key is not None:
        cache.put(key, record, trials)
    logger.info("%s at batch %d: chose %s (%.2fx AR's rows/s on the calibration rows)", base.method, batch, record["label"],
                next(t.ratio_to_ar for t in trials if t.config is chosen))
    return chosen, {**record, "tuned": True}


def weights_id(target: Any, draft: str | Path | None = None) -> str | None:
    """The weights a tuned shape belongs to, ``model:<fingerprint>`` (and ``+draft:<fingerprint>``
    of a draft's folder, first: roles sorted); None when the target was not loaded from a folder
    (nothing identifies its weights)."""
    from raydec.models.registry import weights_fingerprint

    folder = getattr(getattr(target, "model", None), "name_or_path", None)
    if not folder or not Path(folder).is_dir():
        return None
    parts = {"model": weights_fingerprint(folder)}
    if draft is not None and Path(draft).is_dir():
        parts["draft"] = weights_fingerprint(draft)
    return "+".join(f"{role}:{fingerprint}" for role, fingerprint in sorted(parts.items()))


def target_shape_key(config: DecodeConfig, target: Any, batch: int, draft: str | Path | None = None) -> dict | None:
    """The shape cache's key for decoding ``config`` (as resolved for ``target``: its sampling and
    length filled in) on ``target`` at ``batch``, the same for a public function, a job and a Serve
    replica; None when nothing identifies the weights (:func:`weights_id`)."""
    weights = weights_id(target, draft)
    dtype = str(target.dtype).removeprefix("torch.")
    return shape_key(config, weights, device_name(target.device), dtype, batch) if weights else None


def shape_for_call(
    base: DecodeConfig, target: Any, batch: int, run: Callable[[DecodeConfig, list[int]], Any], total_rows: int,
    draft: str | Path | None = None,
) -> DecodeConfig:
    """``base`` with its "auto" shape chosen for ``batch`` on ``target``, calibrating on a call's rows:
    ``run(config, indices)`` decodes the call's rows at ``indices`` with ``config`` (each round its
    own rows, from the first, as far as the call has them, in parts of one batch). draft: the
    folder of the draft ``base`` decodes with (its weights are part of the key)."""
    parts, per_part = round_parts(batch, max(1, min(total_rows, round_size(batch))))
    key = target_shape_key(base, target, batch, draft)

    def seconds(config: DecodeConfig, turn: int) -> float:
        start = time.perf_counter()
        run(config, round_rows(range(total_rows), per_part, turn))
        return time.perf_counter() - start

    captured = resolve_compile(base.compile, target.device)
    config, _ = resolve_shape(base, batch, seconds, per_part * parts, key, parts=parts, captured=captured)
    return config
