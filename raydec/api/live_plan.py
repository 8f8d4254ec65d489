"""A decode plan that follows the live batch: one plan per batch bucket, the bucket of the rows
decoding now, with hysteresis.

    live = LivePlans({1: plan_1, 2: plan_2, 4: plan_4, 8: plan_8}, patience=4, make=make_proposer_for)
    session.follow(live)          # the engine session asks live.proposer_for(rows) before each step
    live.record()                 # the plan in use, steps per plan (/v1/raydec/stats)

Speculation pays less as the batch grows, so the draft shape tuned for a replica's ``batch_size``
is too narrow when one or two rows decode, and the one tuned for one row too wide under load. A
``LivePlans`` holds a plan per bucket (1, 2, 4, ... up to the batch size: ``bucket_sizes``, each
tuned for that batch, or any concrete ``DecodeConfig``), wants the plan of the smallest bucket
that holds the live rows, and switches to it only once it has been wanted instead of the plan in
use for ``patience`` consecutive steps, so a batch whose size wavers does not flap between plans.

Only plain AR and the Jacobi methods can take a running batch over (their per-row state is only
their pending drafts), so only they may be planned per bucket. A switch moves speed, never a
row's law; with ``coupling: gumbel`` a row's tokens do not depend on the plans it met at all.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from raydec.api.plan import DecodePlan
from raydec.api.tuner import shape_label
from raydec.config import JACOBI_METHODS, DecodeConfig
from raydec.speculative.proposers.base import Proposer

DEFAULT_PATIENCE = 4  # consecutive steps a changed plan must be wanted before the batch switches to it
FOLLOWING_METHODS = ("ar",) + JACOBI_METHODS  # the methods whose proposers take a running batch over


def bucket_sizes(batch_size: int) -> list[int]:
    """The batch buckets a plan is made for: 1, 2, 4, ... below ``batch_size``, then ``batch_size``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    sizes, size = [], 1
    while size < batch_size:
        sizes.append(size)
        size *= 2
    return sizes + [batch_size]


def plan_label(config: DecodeConfig) -> str:
    """A config's plan label, as ``DecodePlan.label`` gives it: ``sjd window=8,init=uniform``, or ``ar``."""
    return config.method if config.method == "ar" else f"{config.method} {shape_label(config)}"


class LivePlans:
    """The plan of the live batch, with hysteresis (see the module docstring).

    plans:    {bucket size: DecodePlan or DecodeConfig}, each with a concrete shape, methods ar / sjd /
              sjd_ac / sjd_pac
    patience: consecutive decode steps a plan other than the one in use must be wanted before the
              batch switches to it (1: at once)
    make:     a config's proposer (``make_proposer`` over the target), for ``proposers`` and
              ``proposer_for``: one per distinct plan, built here; None: the plans alone (``update``)
    """

    def __init__(self, plans: Mapping[int, DecodePlan | DecodeConfig], patience: int = DEFAULT_PATIENCE,
                 make: Callable[[DecodeConfig], Proposer] | None = None) -> None:
        if not plans:
            raise ValueError("LivePlans: no plan")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        configs = {int(bucket): plan.decode if isinstance(plan, DecodePlan) else plan for bucket, plan in plans.items()}
        for bucket, config in configs.items():
            if bucket < 1:
                raise ValueError(f"LivePlans: bucket {bucket} must be >= 1")
            if config.method not in FOLLOWING_METHODS:
                raise ValueError(f"LivePlans: bucket {bucket} decodes with {config.method!r}; only {', '.join(FOLLOWING_METHODS)} "
                                 f"can take a running batch over between steps")
            if config.auto_shape:
                raise ValueError(f"LivePlans: bucket {bucket}'s draft shape is 'auto'; plan it for its batch first (plan_decode)")
        self.buckets = sorted(configs)
        self.patience = patience
        self.labels = {bucket: plan_label(configs[bucket]) for bucket in self.buckets}
        self.configs = {self.labels[bucket]: configs[bucket] for bucket in self.buckets}
        self.current: str | None = None  # the plan in use (None before the first step)
        self.waiting = 0  # consecutive steps the wanted plan has differed from the one in use
        self.steps: dict[str, int] = {}
        self.switches = 0
        self._proposers = {label: make(config) for label, config in self.configs.items()} if make is not None else {}

    def bucket_for(self, live_rows: int) -> int:
        """The smallest bucket that holds ``live_rows`` (the largest when none does)."""
        return next((bucket for bucket in self.buckets if bucket >= live_rows), self.buckets[-1])

    def wanted(self, live_rows: int) -> str:
        """The label of the plan a batch of ``live_rows`` rows wants, before hysteresis."""
        return self.labels[self.bucket_for(live_rows)]

    def update(self, live_rows: int) -> str:
        """One decode step of ``live_rows`` rows: the label of the plan it decodes with (the first step
        takes the wanted plan; later, a plan other than the one in use only once it has been wanted for
        ``patience`` consecutive steps, this one included), counted."""
        wanted = self.wanted(live_rows)
        if self.current is None:
            self.current = wanted
        elif wanted == self.current:
            self.waiting = 0
        else:
            self.waiting += 1
            if self.waiting >= self.patience:
                self.current, self.waiting = wanted, 0
                self.switches += 1
        self.steps[self.current] = self.steps.get(self.current, 0) + 1
        return self.current

    @property
    def config(self) -> DecodeConfig | None:
        """The plan in use (None before the first step)."""
        return self.configs[self.current] if self.current is not None else None

    # -- the policy an engine session follows (raydec.speculative.live_proposer) -----------------

    def proposers(self) -> dict[str, Proposer]:
        """Every plan's proposer, by plan label."""
        if not self._proposers:
            raise ValueError("LivePlans: built without make, it has no proposers (plans alone)")
        return dict(self._proposers)

    def proposer_for(self, live_rows: int) -> Proposer:
        """The proposer of the next decode step of ``live_rows`` rows (``update``)."""
        if not self._proposers:
            self.proposers()  # raises: plans alone
        return self._proposers[self.update(live_rows)]

    def record(self) -> dict[str, Any]:
        """What ``/v1/raydec/stats`` shows: the plan in use, decode steps per plan, switches, the plan per bucket."""
        return {"plan_in_use": self.current, "steps_per_plan": dict(self.steps), "switches": self.switches,
                "patience": self.patience, "buckets": {str(bucket): self.labels[bucket] for bucket in self.buckets}}
