"""The proposer interface: build draft trees, learn from what the verifier accepted.

Like Hugging Face's ``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``):
``propose`` returns a ``DraftTree`` for the active rows; ``observe`` receives the target's
processed distributions over that tree and the verification result. A proposer keeps its
per-row state keyed by the row's id (rows leave the batch when they finish) and draws random
numbers only from ``state.random`` (counter-based per row: seed, step, its own stream), so
a row's drafts never depend on the other rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from raydec.speculative.random import RowRandom
from raydec.speculative.sampling import VocabConstraint
from raydec.speculative.tree import DraftTree

if TYPE_CHECKING:
    from raydec.speculative.target import ForwardOutput
    from raydec.speculative.verify import VerifyResult


@dataclass
class Prefill:
    """The left-padded prompt window the target just read (model rows), for draft models.

    output:        the prefill forward (logits [M, L, V]; hidden [M, L, H] when ``wants_hidden``)
    inputs_embeds: [M, L, H] layer-0 embeddings (image features merged in)
    valid:         [M, L] bool, False on left padding
    image_index:   [M, L] long, image of the row's prompt a position belongs to (-1 = text / pad)
    room:          cache slots the rows' prompts and whole decode take at most (0: unknown), which
                   the target's cache reserves; a draft's cache may reserve them too
    """

    output: "ForwardOutput"
    inputs_embeds: torch.Tensor
    valid: torch.Tensor
    image_index: torch.Tensor
    room: int = 0


@dataclass
class DecodeState:
    """What a proposer may look at for the active rows (in batch order).

    row_handles: the session handles of the active rows, in batch order
    generated:  per active row, the committed output tokens so far (last one = the root)
    random:     the active rows' counter-based streams at this step (on the target's device)
    coupling:   "rejection", "gumbel" or "mixed" (``random.coupled`` says which rows): a
                coupled row is verified by a match with the target's Gumbel-max sample, and its
                drafts pay most when made with the same noise (``random.exponentials``)
    """

    row_handles: list[int]
    generated: list[list[int]]
    random: RowRandom
    vocab_size: int
    constraint: VocabConstraint | None
    prob_dtype: torch.dtype
    coupling: str = "rejection"

    @property
    def batch_size(self) -> int:
        return len(self.row_handles)

    @property
    def device(self) -> torch.device:
        return self.random.seeds.device

    def roots(self) -> torch.Tensor:
        """[B] last committed token of every active row (host lists -> the device)."""
        return torch.tensor([tokens[-1] for tokens in self.generated], dtype=torch.long, device=self.device)


class Proposer(ABC):
    """Base class of every drafting strategy (AR is the one that proposes nothing)."""

    #: the engine passes last hidden states in ``observe`` when True (draft-model proposers)
    wants_hidden: bool = False
    #: rows may join a running batch (continuous batching): ``admit`` is implemented
    admits_rows: bool = False
    #: it may take a running batch over from another proposer between two steps (``take_over``):
    #: its per-row state can start afresh from the rows' committed tokens (a session that follows a
    #: policy, ``raydec.speculative.live_proposer``, swaps in only such proposers)
    takes_over: bool = False

    #: the engine captures the step (``raydec.speculative.capture``): proposers run their pure
    #: tensor work as ``StepGraph``s when set (``capture``)
    captured: bool = False

    def capture(self, enabled: bool, device: torch.device) -> None:
        """Told once by the engine whether its step is captured, on which device."""
        self.captured = enabled

    def step_graphs(self) -> tuple:
        """The ``StepGraph``s this proposer runs its tensor work in (none: it has none)."""
        return ()

    def start(self, state: DecodeState, first_probs: torch.Tensor, prefill: Prefill) -> None:
        """Called once per ``generate`` after prefill; reset per-row state here.

        first_probs: [B, V] the target's P for the first token; ``state.generated`` holds it.
        """

    def admit(self, state: DecodeState, first_probs: torch.Tensor, prefill: Prefill) -> None:
        """Rows joining the running batch (``state`` holds only them, after their prefill);
        the next ``propose`` sees them after the rows already decoding. Only called when
        ``admits_rows``."""
        raise NotImplementedError(f"{type(self).__name__} cannot take rows into a running batch")

    def take_over(self, state: DecodeState) -> None:
        """Take the running batch ``state`` (every active row, mid-decode) from another proposer
        between two steps; whatever this proposer kept of earlier steps is stale. Only called when
        ``takes_over``."""
        raise NotImplementedError(f"{type(self).__name__} cannot take over a running batch")

    @abstractmethod
    def propose(self, state: DecodeState) -> DraftTree:
        """A draft tree per active row, rooted at the row's last committed token."""

    def observe(
        self,
        state: DecodeState,
        tree: DraftTree,
        target_probs: torch.Tensor,
        result: "VerifyResult",
        output: "ForwardOutput",
    ) -> None:
        """After verification. target_probs: [B, N, V]; ``state.generated`` already holds the commit;
        ``result.accepted_counts`` holds each row's accepted draft count on the host."""
