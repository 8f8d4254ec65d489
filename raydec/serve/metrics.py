"""A model replica's metrics, exported through Ray's metrics (Prometheus) and kept as totals
for ``GET /v1/raydec/stats``.

The speculative-decoding counters mean what vLLM's ``vllm:spec_decode_*`` counters mean, under
raydec's prefix: drafts (verifications of a row that had a draft), draft tokens (draft nodes
verified), accepted tokens (draft tokens committed), accepted tokens per position.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping

from raydec.config import DRAFT_METHODS, JACOBI_METHODS, DecodeConfig
from raydec.serve.boundary import RowStats
from raydec.serve.engine_messages import RowTiming

LATENCY_BOUNDARIES = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
TOKEN_BOUNDARIES = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
MAX_POSITIONS = 16  # accepted-per-position counters kept for the first 16 draft positions


def draft_tokens_per_step(config: DecodeConfig) -> int:
    """Draft nodes a row puts before the target per step under ``config`` (0 for ar)."""
    if config.method in JACOBI_METHODS:
        return config.jacobi.window
    if config.method in DRAFT_METHODS:
        return config.tree.total_tokens - 1
    return 0


class ReplicaMetrics:
    """Counters and histograms of one model replica (thread-safe)."""

    def __init__(self, model: str) -> None:
        from ray.util import metrics

        tags = {"model": model}
        self._lock = threading.Lock()
        self.totals: dict[str, float] = {
            "requests": 0, "rows": 0, "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
            "output_tokens": 0, "target_forwards": 0,
        }
        self.accepted_per_pos = [0] * MAX_POSITIONS

        def counter(name: str, description: str, keys: tuple[str, ...] = ("model",)) -> Any:
            metric = metrics.Counter(f"raydec_{name}", description=description, tag_keys=keys)
            metric.set_default_tags(tags)
            return metric

        def histogram(name: str, description: str, boundaries: list[float]) -> Any:
            metric = metrics.Histogram(f"raydec_{name}", description=description, boundaries=boundaries, tag_keys=("model",))
            metric.set_default_tags(tags)
            return metric

        self.num_drafts = counter("spec_decode_num_drafts", "Verifications of rows that had a draft.")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accepted_tokens_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at each draft position.", ("model", "position"))
        self.output_tokens = counter("generation_tokens", "Tokens generated.")
        self.plan_steps = counter("decode_steps_per_plan", "Decode steps of a replica that follows its live batch, per plan.",
                                  ("model", "plan"))
        self._plan_steps_seen: dict[str, int] = {}
        self.ttft = histogram("time_to_first_token_seconds", "Request arrival at the replica to its first token.", LATENCY_BOUNDARIES)
        self.tpot = histogram("time_per_output_token_seconds", "Decode time per output token after the first.", TOKEN_BOUNDARIES)
        self.e2e = histogram("e2e_request_latency_seconds", "Request arrival at the replica to its result.", LATENCY_BOUNDARIES)
        self.queue_time = histogram("request_queue_time_seconds", "Arrival at the replica to the row's prefill.", LATENCY_BOUNDARIES)
        self.batch_size = metrics.Gauge("raydec_batch_size", description="Mean rows per decode step since start.", tag_keys=("model",))
        self.batch_size.set_default_tags(tags)

    def finished(self, submitted_at: float, timing: RowTiming, result: RowStats) -> None:
        """Record one finished row (its request sent to the engine at ``submitted_at``, ``time.perf_counter``):
        its accepted lengths, latencies and tokens."""
        now = time.perf_counter()
        draft_per_step = timing.draft_per_step
        lengths = list(result.accepted_lengths)
        drafts = len(lengths) if draft_per_step else 0
        accepted = sum(max(0, n - 1) for n in lengths) if draft_per_step else 0
        if drafts:  # a row that ended before its first speculative step verified no draft (a counter takes no 0)
            self.num_drafts.inc(drafts)
            self.num_draft_tokens.inc(drafts * draft_per_step)
        if accepted:
            self.num_accepted_tokens.inc(accepted)
        per_pos = [0] * MAX_POSITIONS
        for n in lengths if draft_per_step else ():
            for position in range(min(n - 1, MAX_POSITIONS)):
                per_pos[position] += 1
        for position, count in enumerate(per_pos):
            if count:
                self.accepted_tokens_per_pos.inc(count, tags={"position": str(position)})
        if result.tokens:
            self.output_tokens.inc(result.tokens)
        arrived = submitted_at
        admitted = timing.admitted_at or arrived
        first = timing.first_token_at or admitted
        self.e2e.observe(now - arrived)
        self.queue_time.observe(max(0.0, admitted - arrived))
        self.ttft.observe(max(0.0, first - arrived))
        if result.tokens > 1:
            self.tpot.observe(max(0.0, now - first) / (result.tokens - 1))
        with self._lock:
            totals = self.totals
            totals["rows"] += 1
            totals["num_drafts"] += drafts
            totals["num_draft_tokens"] += drafts * draft_per_step
            totals["num_accepted_tokens"] += accepted
            totals["output_tokens"] += result.tokens
            totals["target_forwards"] += result.target_forwards
            self.accepted_per_pos = [a + b for a, b in zip(self.accepted_per_pos, per_pos)]

    def record_plan_steps(self, steps: Mapping[str, int]) -> None:
        """Export the decode steps per plan label (totals since start) counted since the last call."""
        for label, total in dict(steps).items():
            new = total - self._plan_steps_seen.get(label, 0)
            if new > 0:
                self.plan_steps.inc(new, tags={"plan": label})
                self._plan_steps_seen[label] = total

    def record_batch(self, mean_batch_size: float) -> None:
        self.batch_size.set(mean_batch_size)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self.totals, "accepted_per_pos": list(self.accepted_per_pos)}
