"""Whether two tokens at one position of a row are a numeric near-tie, or a decoding bug.

Under ``coupling: gumbel`` the token at generated position j is ``argmax over the kept tokens of
log P_j + G_j`` (``G_j = -log E_j``, the row's noise at j; greedy: the argmax of the processed
logits, no noise). Plain AR and a speculative method compute ``P_j`` with different kernels (a
one-token step, a window or a tree; other batch shapes), so in low precision their scores differ
in the last bits, and where two tokens' perturbed scores are that close the two decodes can pick
different tokens. ``classify_difference`` recomputes position j with one forward of the same
prefix on a higher-precision copy of the target and measures how far each of the two tokens is
from winning there:

- the race: best perturbed score among the kept tokens minus the token's own;
- the cut: a token that top-k / top-p left out must first overtake the least likely kept token
  (its log-probability's distance to that token's), as a rounding can move it across the cut.

The larger of the two tokens' distances is the *gap*. It is compared with the rounding of the
checked dtype at the scores' magnitude: ``TIE_ULPS[dtype] * eps(dtype) * M``, where M is the
largest absolute raw logit at the position, times ``|s| + |1 - s|`` under classifier-free guidance
of scale s, over the temperature (a logit's rounding scales with the largest ones: a matrix
product's error follows its operands' norms), and ``TIE_ULPS`` a per-dtype multiple measured on
the reference models. A gap within it is a near-tie; a larger one is a decoding bug: AR's token
and the method's cannot both be the target's sample of that prefix. In 16-bit dtypes the
tolerance can be wide (bfloat16 keeps 8 bits of a logit), so a bug that moves a token by less
than it looks like rounding there; in float64 nothing does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from raydec.config import SamplingConfig
from raydec.speculative.engine import Engine
from raydec.speculative.proposers.base import DecodeState, Prefill, Proposer
from raydec.speculative.random import RowRandom
from raydec.speculative.requests import RowRequest
from raydec.speculative.sampling import process_logits
from raydec.speculative.tree import DraftTree, TreeBuilder

#: the tolerance per dtype, in units of eps(dtype) times the scores' magnitude. On the reference models
#: (docs/benchmarks.md, "raydec check"), the difference of the two best tokens' perturbed scores computed in a
#: dtype moved from its float64 value by at most 1.41 such units in bfloat16 and float16, and 12.7 in float32
#: (8,352 positions: 24 images, 24 greedy and 24 sampled captions). AR and the method each carry such an error,
#: so a flip needs a gap below twice the largest: 2.8 and 25.4, rounded up to a power of two. float64 takes
#: float32's multiple.
TIE_ULPS = {torch.bfloat16: 4.0, torch.float16: 4.0, torch.float32: 32.0, torch.float64: 32.0}


@dataclass
class PositionScores:
    """The target's scores of one row at one generated position, from a forward of its prefix.

    log_probs: [V] float64, log P before top-k / top-p (temperature, guidance, penalty and
               vocabulary constraint applied; for greedy rows at temperature 1)
    kept:      [V] bool, the tokens top-k / top-p keep (greedy: every allowed token)
    gumbel:    [V] float64, the row's noise G at the position (zeros for greedy rows)
    magnitude: the largest absolute raw logit at the position, scaled as the scores are
    """

    log_probs: torch.Tensor
    kept: torch.Tensor
    gumbel: torch.Tensor
    magnitude: float

    @property
    def perturbed(self) -> torch.Tensor:
        """[V] float64 log P + G, -inf where not kept."""
        return torch.where(self.kept, self.log_probs + self.gumbel, torch.full_like(self.log_probs, -math.inf))

    def token(self) -> int:
        """The token this forward picks: the best perturbed score among the kept tokens."""
        return int(self.perturbed.argmax())

    def distance(self, token: int) -> float:
        """How far ``token`` is from being picked: the race and the cut, the larger (0: it is picked)."""
        race = float(self.perturbed.max()) - float(self.log_probs[token] + self.gumbel[token])
        cut = 0.0
        if not bool(self.kept[token]):
            cut = float(self.log_probs[self.kept].min()) - float(self.log_probs[token])
        return max(race, cut, 0.0)


@dataclass
class TieVerdict:
    """The first differing position of a row, recomputed.

    gap: how far the farther of AR's and the method's token is from winning in the
    ``reference_dtype`` forward (see the module docstring); tolerance: the checked dtype's rounding
    at the scores' magnitude; reference_token: what that forward picks.
    """

    position: int
    ar_token: int
    method_token: int
    gap: float
    tolerance: float
    near_tie: bool
    reference_token: int
    reference_dtype: str

    def as_dict(self) -> dict[str, Any]:
        return {"position": self.position, "ar_token": self.ar_token, "method_token": self.method_token, "gap": self.gap,
                "tolerance": self.tolerance, "near_tie": self.near_tie, "reference_token": self.reference_token,
                "reference_dtype": self.reference_dtype}


class PrefixProposer(Proposer):
    """Drafts a fixed prefix as one chain, rooted at its first token, and records the target's
    P and raw logits after its last node (or the prefill's, for an empty prefix). One step."""

    def __init__(self, prefix: Sequence[int]) -> None:
        self.prefix = [int(t) for t in prefix]
        self.probs: torch.Tensor | None = None   # [V]
        self.logits: torch.Tensor | None = None  # [M, V] (M: 2 under guidance)

    def start(self, state: DecodeState, first_probs: torch.Tensor, prefill: Prefill) -> None:
        if not self.prefix:
            self.probs, self.logits = first_probs[0].clone(), prefill.output.logits[:, -1].clone()

    def propose(self, state: DecodeState) -> DraftTree:
        builder = TreeBuilder(self.prefix[0])  # the root is the prefix's, whatever this precision sampled first
        builder.add_chain(0, self.prefix[1:])
        return DraftTree.stack([builder], state.vocab_size, state.prob_dtype)

    def observe(self, state: DecodeState, tree: DraftTree, target_probs: torch.Tensor, result: Any, output: Any) -> None:
        last = len(self.prefix) - 1
        self.probs, self.logits = target_probs[0, last].clone(), output.logits[:, last].clone()


def position_scores(target: Any, sampling: SamplingConfig, prompt: Any, seed: int, prefix: Sequence[int], *,
                    constraint: Any = None, max_positions: int | None = None) -> PositionScores:
    """The scores of the row (``prompt``, ``seed``) at generated position ``len(prefix)`` after ``prefix``,
    from one prefill and one forward of the prefix as a chain on ``target``."""
    greedy = sampling.greedy
    untruncated = sampling.model_copy(update={"temperature": 1.0 if greedy else sampling.temperature, "top_k": 0, "top_p": 1.0})
    proposer = PrefixProposer(prefix)
    engine = Engine(target, proposer, untruncated, len(prefix) + 1, constraint=constraint, max_positions=max_positions,
                    compile="off", coupling="gumbel")  # no EOS: the row reaches its last position whatever it samples
    session = engine.session(batch_size=1)
    session.submit(RowRequest(prompt, seed=seed, max_new_tokens=len(prefix) + 1))
    session.step()  # the prefill
    if prefix:
        session.step()  # the prefix's forward
    assert proposer.probs is not None and proposer.logits is not None
    log_probs = proposer.probs.to(torch.float64).log().cpu()  # [V]
    vocab = log_probs.shape[0]
    if greedy:
        kept, gumbel = log_probs > -math.inf, torch.zeros(vocab, dtype=torch.float64)
    else:  # top-k / top-p over log P keep what they keep over the scores (the same order and differences)
        cut = SamplingConfig(temperature=1.0, top_k=sampling.top_k, top_p=sampling.top_p)
        kept = process_logits(log_probs.view(1, 1, vocab), cut, 1)[0, 0] > 0
        noise = RowRandom.for_seeds([seed]).at_positions(torch.tensor([len(prefix)])).exponentials(torch.zeros(1, dtype=torch.long), vocab)
        gumbel = -noise[0, 0].log()
    logits = proposer.logits.to(torch.float64)
    magnitude = float(logits[torch.isfinite(logits)].abs().max())
    if sampling.uses_cfg:
        magnitude *= abs(sampling.cfg_scale) + abs(1.0 - sampling.cfg_scale)
    if not greedy:
        magnitude /= sampling.temperature
    return PositionScores(log_probs, kept, gumbel, magnitude)


def tolerance(dtype: torch.dtype, magnitude: float) -> float:
    """The rounding of ``dtype`` at scores of ``magnitude``, ``TIE_ULPS[dtype]`` times over."""
    return TIE_ULPS.get(dtype, 32.0) * torch.finfo(dtype).eps * magnitude


def classify_difference(scores: PositionScores, position: int, ar_token: int, method_token: int, dtype: torch.dtype,
                        reference_dtype: torch.dtype) -> TieVerdict:
    """Whether AR's and the method's tokens at ``position`` are a near-tie in ``dtype`` (``scores``:
    from a ``reference_dtype`` forward of the prefix)."""
    gap = max(scores.distance(ar_token), scores.distance(method_token))
    allowed = tolerance(dtype, scores.magnitude)
    return TieVerdict(position, ar_token, method_token, gap, allowed, gap <= allowed, scores.token(),
                      str(reference_dtype).replace("torch.", ""))
