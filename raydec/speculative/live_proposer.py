"""A session whose proposer follows its live batch: before each decode step it asks a policy
which proposer the batch's rows should decode with, and swaps it in between two steps.

    session.follow(policy)        # policy.proposers(): {label: proposer}; policy.proposer_for(rows)
    session.step()                # the chosen proposer takes the batch over when it is another
    session.steps_by_proposer     # decode steps per proposer label, since ``follow``

Only proposers that can take a running batch over (``Proposer.takes_over``: plain AR, and the
Jacobi proposers, whose per-row state is only their pending drafts) may be swapped in; a policy
that lists any other is refused when the session is told to follow it. A swapped-in proposer is
captured as the engine's own is (``Proposer.capture``), once, when the session starts following.

What a swap changes: how many tokens a step commits, never the law of a row's tokens (every
proposer reports the ``q`` it drafted from). In ``coupling: "gumbel"`` a row's tokens are its
seed's whatever drafted them, so they do not depend on the proposers it met either; in
``"rejection"`` a seed's sample depends on the drafts, and so on when the swaps came.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Protocol

from raydec.speculative.proposers.base import DecodeState, Proposer
from raydec.speculative.target import DecodingTarget


class ProposerPolicy(Protocol):
    """Which proposer a batch of ``live_rows`` rows decodes its next step with."""

    def proposers(self) -> Mapping[str, Proposer]:
        """Every proposer it may choose, by label."""

    def proposer_for(self, live_rows: int) -> Proposer:
        """The proposer of the next decode step of a batch of ``live_rows`` rows (one of ``proposers``)."""


class SwappingEngine(Protocol):
    """What a following session swaps the proposer of (an ``Engine``)."""

    proposer: Proposer
    captured: bool
    target: DecodingTarget


class LiveProposer:
    """A following session's record: the policy, its proposers' labels, decode steps per label."""

    def __init__(self, engine: SwappingEngine, policy: ProposerPolicy) -> None:
        proposers = dict(policy.proposers())
        if not proposers:
            raise ValueError("follow: the policy lists no proposer")
        refused = [f"{label!r} ({type(proposer).__name__})" for label, proposer in proposers.items() if not proposer.takes_over]
        if refused:
            raise ValueError(f"follow: {', '.join(refused)} cannot take over a running batch between steps; a policy may "
                             f"choose only proposers that can (plain AR and the Jacobi methods: Proposer.takes_over)")
        for proposer in proposers.values():
            proposer.capture(engine.captured, engine.target.device)
        self.engine, self.policy = engine, policy
        self.labels = {id(proposer): label for label, proposer in proposers.items()}
        self.steps: Counter[str] = Counter()
        self.swaps = 0  # times another proposer took the batch over

    def before_step(self, state: DecodeState) -> None:
        """Before a decode step of ``state``'s rows: the policy's proposer takes the batch over when
        it is not the engine's now; the step is counted under its label."""
        proposer = self.policy.proposer_for(state.batch_size)
        label = self.labels.get(id(proposer))
        if label is None:
            raise ValueError(f"follow: the policy chose a {type(proposer).__name__} it does not list among its proposers")
        if proposer is not self.engine.proposer:
            proposer.take_over(state)
            self.engine.proposer = proposer
            self.swaps += 1
        self.steps[label] += 1


class FollowsPolicy:
    """What a ``DecodeSession`` adds to follow a policy (``follow``); the session has ``engine``."""

    engine: SwappingEngine
    follower: LiveProposer | None = None

    def follow(self, policy: ProposerPolicy | None) -> None:
        """Take the proposer from ``policy`` before each decode step (None: keep the engine's proposer
        from now on). A ValueError when the policy lists a proposer that cannot take a batch over."""
        self.follower = LiveProposer(self.engine, policy) if policy is not None else None

    @property
    def steps_by_proposer(self) -> dict[str, int]:
        """Decode steps per proposer label since the session began to follow its policy."""
        return dict(self.follower.steps) if self.follower is not None else {}

    def _take_proposer(self, state: DecodeState) -> None:
        if self.follower is not None:
            self.follower.before_step(state)
