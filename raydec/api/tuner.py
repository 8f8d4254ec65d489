"""The measured tuner: which of a method's draft shapes, plain AR among them, decodes a batch fastest.

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
latency-bound caller at batch 1 gets the same answer, since one row's latency is its throughput.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from raydec.config import JACOBI_METHODS, DecodeConfig

logger = logging.getLogger(__name__)

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
        jacobi = config.jacobi
        tree = f",K={jacobi.branching},D={jacobi.tree_depth}" if jacobi.branching > 1 and jacobi.tree_depth > 0 else ""
        return f"window={jacobi.window}{tree},init={jacobi.init}"
    tree = config.tree
    return f"tree={tree.depth}x{tree.top_k}/{tree.total_tokens}"


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
