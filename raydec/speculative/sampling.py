"""Target logits -> the processed distribution ``P`` that plain AR sampling draws from.

Every acceptance test in raydec runs on this fully processed ``P``: CFG mix of paired rows,
vocabulary constraints and forced tokens, temperature, top-k, top-p. Temperature 0 gives a
one-hot argmax, so greedy decoding is the same verifier in its deterministic limit.

Randomness is counter-based per row (``raydec.speculative.random``); sampling here takes the
uniforms it is given (``sample_with_uniform``), so it runs batched on any device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from raydec.config import SamplingConfig

# gen_index [B, N] (0-based index of the generated token being predicted) -> forced id or -1, [B, N]
ForcedTokenFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class VocabConstraint:
    """Model-layout constraints on the output vocabulary.

    allowed: [V] bool, tokens that may ever be sampled (e.g. image ids only), or None for all.
    forced:  maps the generated-token index to a forced token id (-1 = not forced), e.g. Emu3's
             end-of-line after every row of the image grid.
    """

    allowed: torch.Tensor | None = None
    forced: ForcedTokenFn | None = None

    def __post_init__(self) -> None:
        # whether ``allowed`` removes anything, known once on the host (not read back every step)
        object.__setattr__(self, "restricts", self.allowed is not None and not bool(self.allowed.all()))


def mix_cfg(logits: torch.Tensor, num_rows: int, scale: float, space: str = "logits", out: torch.Tensor | None = None) -> torch.Tensor:
    """Classifier-free guidance over paired rows: ``u + s * (c - u)``.

    logits: [2B, N, V], each request's conditional row, then its unconditional one.  -> [B, N, V]
    (written to ``out`` when given)
    """
    if logits.shape[0] != 2 * num_rows:
        raise ValueError(f"CFG expects {2 * num_rows} model rows (cond + uncond), got {logits.shape[0]}")
    if space == "logprobs":
        logits = torch.log_softmax(logits, dim=-1)
    pairs = logits.view(num_rows, 2, *logits.shape[1:])  # [B, 2, N, V]
    cond, uncond = pairs[:, 0], pairs[:, 1]
    return torch.sub(cond, uncond, out=out).mul_(scale).add_(uncond)  # one [B, N, V] written, the same rounding


def kth_largest(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest value along the last dim (1-based). scores: [..., V] -> [..., 1]"""
    return torch.topk(scores, k, dim=-1).values[..., -1:]


def _apply_top_k(scores: torch.Tensor, top_k: int, in_place: bool = False) -> torch.Tensor:
    # scores: [..., V]; keeps ties at the k-th value (as Hugging Face does)
    if top_k <= 0 or top_k >= scores.shape[-1]:
        return scores
    below = scores < kth_largest(scores, top_k)
    return scores.masked_fill_(below, float("-inf")) if in_place else scores.masked_fill(below, float("-inf"))


def _apply_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    # scores: [..., V]; smallest set whose mass reaches top_p, always >= 1 token
    if top_p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1.0 - top_p)
    remove_sorted[..., -1] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def apply_repetition_penalty(scores: torch.Tensor, context: torch.Tensor, penalty: float | torch.Tensor) -> torch.Tensor:
    """Hugging Face's repetition penalty: s / penalty (s > 0) or s * penalty for tokens in context.

    scores: [B, N, V]; context: [B, N, V] bool, the tokens each position's context holds;
    penalty: a number, or [B, 1, 1] per row
    """
    penalised = torch.where(scores > 0, scores / penalty, scores * penalty)
    return torch.where(context.to(scores.device), penalised, scores)


@dataclass(frozen=True)
class RowSampling:
    """Per-row sampling parameters of a batch whose rows were asked for different ones
    (online traffic mixes requests). Each is [B] on the logits' device; each row's processed P
    is exactly what ``process_logits`` with that row's own ``SamplingConfig`` gives.

    temperature (0: greedy), top_k (0: off), top_p (1: off), repetition_penalty (1: off);
    max_top_k: the largest top_k (host); penalised: some row has a repetition penalty (host);
    nucleus: some row has top_p < 1 (host).
    CFG (scale and space) is one for the batch: ``cfg_scale``, ``cfg_space``.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    repetition_penalty: torch.Tensor
    max_top_k: int
    penalised: bool
    nucleus: bool = True
    cfg_scale: float = 1.0
    cfg_space: str = "logits"

    @classmethod
    def of(cls, configs: list[SamplingConfig], device: torch.device | str = "cpu") -> "RowSampling":
        cfg = {(c.cfg_scale, c.cfg_space) for c in configs}
        if len(cfg) > 1:
            raise ValueError(f"sampling.cfg_scale / cfg_space must be the same for rows decoding together, got {sorted(cfg)}")
        scale, space = cfg.pop()

        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            column([c.temperature for c in configs], torch.float64), column([c.top_k for c in configs], torch.long),
            column([c.top_p for c in configs], torch.float64), column([c.repetition_penalty for c in configs], torch.float64),
            max(c.top_k for c in configs), any(c.repetition_penalty != 1.0 for c in configs),
            any(c.top_p < 1.0 for c in configs), scale, space,
        )

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale != 1.0


def _softmax(scores: torch.Tensor, owned: bool) -> torch.Tensor:
    """softmax over the last dim; over ``scores`` itself when it is a tensor of our own on the
    CPU, where a fresh [B, N, V] costs its page faults (CPU softmax is per row and elementwise
    within it, so writing over its input gives the same bits: tested). Elsewhere a new tensor."""
    if owned and scores.device.type == "cpu" and scores.is_contiguous():
        return torch.softmax(scores, dim=-1, out=scores)
    return torch.softmax(scores, dim=-1)


def _process_per_row(scores: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """temperature -> top-k -> top-p with each row's own values. scores: [B, N, V] -> probs"""
    vocab = scores.shape[-1]
    per_row = lambda t: t.to(scores.device).view(-1, 1, 1)  # noqa: E731  [B] -> [B, 1, 1]
    temperature = per_row(rows.temperature).to(scores.dtype)
    greedy = temperature == 0
    scores = scores / torch.where(greedy, 1.0, temperature)  # a new tensor: the rest works in place
    if 0 < rows.max_top_k:
        k = min(rows.max_top_k, vocab)
        top_k = per_row(rows.top_k)
        kth = torch.topk(scores, k, dim=-1).values.gather(-1, (top_k.clamp(1, k) - 1).expand(*scores.shape[:-1], 1))
        filtering = (top_k > 0) & (top_k < vocab)
        scores.masked_fill_(filtering & (scores < kth), float("-inf"))  # ties at the k-th stay
    if rows.nucleus:
        top_p = per_row(rows.top_p).to(scores.dtype)
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = (cumulative <= (1.0 - top_p)) & (top_p < 1.0)
        remove_sorted[..., -1] = False
        scores.masked_fill_(remove_sorted.scatter(-1, order, remove_sorted), float("-inf"))
    best = scores.argmax(dim=-1, keepdim=True)
    probs = _softmax(scores, owned=True)
    return torch.where(greedy, torch.zeros_like(probs).scatter_(-1, best, 1.0), probs)


def process_logits(
    logits: torch.Tensor,
    config: SamplingConfig | RowSampling,
    num_rows: int,
    constraint: VocabConstraint | None = None,
    gen_index: torch.Tensor | None = None,
    context: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    in_place: bool = True,
) -> torch.Tensor:
    """Raw model logits -> processed probabilities ``P``.

    logits:    [M, N, V] with M = B (no CFG) or 2B (CFG: each request's cond row, then its uncond row)
    gen_index: [B, N] index of the generated token each position predicts (for forced tokens)
    context:   [B, N, V] bool, tokens in each position's context (prompt, generated, the
               tree path to it); needed when ``config.repetition_penalty != 1``
    out:       a [B, N, V] work-dtype tensor P may be computed in (a caller's buffer kept
               across steps: its contents are lost, and the result may be it)
    in_place:  work over tensors of its own in place where that saves a copy (False: never; a
               captured graph fuses the steps instead)
    returns:   [B, N, V] probabilities, float32 (float64 if the logits are float64)
    """
    work_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    scores = logits.to(work_dtype)
    if out is not None and (out.shape != (num_rows, *scores.shape[1:]) or out.dtype != work_dtype or out.device != scores.device):
        out = None
    if config.uses_cfg:
        scores = mix_cfg(scores, num_rows, config.cfg_scale, config.cfg_space, out=out)
    elif scores.shape[0] != num_rows:
        raise ValueError(f"expected {num_rows} model rows without CFG, got {scores.shape[0]}")
    per_row = isinstance(config, RowSampling)
    if (config.penalised if per_row else config.repetition_penalty != 1.0):
        if context is None:
            raise ValueError("sampling.repetition_penalty needs the context tokens of every position")
        penalty = config.repetition_penalty.to(scores.device, scores.dtype).view(-1, 1, 1) if per_row else config.repetition_penalty
        scores = apply_repetition_penalty(scores, context, penalty)

    if constraint is not None and constraint.restricts:
        scores = scores.masked_fill(~constraint.allowed.to(scores.device), float("-inf"))
    forced = None
    if constraint is not None and constraint.forced is not None and gen_index is not None:
        forced = constraint.forced(gen_index).to(scores.device)  # [B, N]

    if per_row:
        probs = _process_per_row(scores, config)
    elif config.greedy:
        probs = torch.zeros_like(scores)
        probs.scatter_(-1, scores.argmax(dim=-1, keepdim=True), 1.0)
    else:
        if config.temperature != 1.0:
            scores = torch.div(scores, config.temperature, out=out if scores is not out else None)
        owned = lambda: in_place and scores.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr()  # noqa: E731  not the model's logits
        scores = _apply_top_k(scores, config.top_k, in_place=owned())
        scores = _apply_top_p(scores, config.top_p)
        probs = _softmax(scores, owned())

    if forced is not None:  # a forced position's P is one-hot at its token
        is_forced = (forced >= 0).unsqueeze(-1)
        probs = probs.masked_fill(is_forced, 0.0).scatter_add(-1, forced.clamp(min=0).unsqueeze(-1), is_forced.to(probs.dtype))
    return probs


# ---------------------------------------------------------------------------------------------
# Sampling with given uniforms


SAMPLE_BLOCK = 256  # entries per block of the two-level inverse CDF


def sample_with_uniform(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative mass reaches ``(1 - u) * total``.

    probs: [..., V] (need not be normalised); uniform: [...] in [0, 1)  -> [...] token ids.
    Tokens of zero mass are never returned, since the threshold is strictly positive: the sums
    and the threshold are float64, where a float64 uniform stays below 1 (in float32, one in
    2**25 of them rounds to 1.0, a zero threshold, and token 0 whatever its mass).

    Two levels over a large vocabulary: the threshold picks a block of ``SAMPLE_BLOCK`` tokens by
    the blocks' cumulative sums, then a token inside it (float64). One reduction over V instead of
    a float64 copy of it and a sequential scan. Block sums are taken in P's dtype (a float32 sum
    of 256 entries is within about 1e-7 of its mass, the precision P itself has): the token one
    cumulative sum over V gives, except where the threshold falls within that rounding of a
    block's edge. Zero-mass tokens stay impossible.
    """
    vocab = probs.shape[-1]
    if vocab <= 2 * SAMPLE_BLOCK:
        return _inverse_cdf(probs.to(torch.float64), uniform.to(torch.float64))
    full = vocab // SAMPLE_BLOCK * SAMPLE_BLOCK
    sums = probs[..., :full].unflatten(-1, (-1, SAMPLE_BLOCK)).sum(dim=-1)                        # [..., V // block]
    if full < vocab:
        sums = torch.cat([sums, probs[..., full:].sum(dim=-1, keepdim=True)], dim=-1)
    cumulative = sums.to(torch.float64).cumsum(dim=-1)
    threshold = ((1.0 - uniform.to(torch.float64)) * cumulative[..., -1]).unsqueeze(-1)          # [..., 1]
    block = torch.searchsorted(cumulative, threshold.contiguous()).clamp(max=sums.shape[-1] - 1)  # [..., 1]
    before = torch.where(block > 0, cumulative.gather(-1, (block - 1).clamp(min=0)), 0.0)        # mass of earlier blocks
    index = block * SAMPLE_BLOCK + torch.arange(SAMPLE_BLOCK, device=probs.device)                # [..., block]
    weights = probs.gather(-1, index.clamp(max=vocab - 1)).to(torch.float64).masked_fill(index >= vocab, 0.0)
    # threshold - before > 0: the first entry reaching it has mass; never past the block's last with mass
    inside = _inverse_cdf(weights, None, (threshold - before).squeeze(-1))
    return block.squeeze(-1) * SAMPLE_BLOCK + inside


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor | None, threshold: torch.Tensor | None = None) -> torch.Tensor:
    """The first entry whose float64 cumulative sum reaches the threshold (``(1 - u) * total``
    unless given), never past the last entry with mass. weights: [..., n] float64 -> [...]"""
    cumulative = weights.cumsum(dim=-1)
    total = cumulative[..., -1:]
    if threshold is None:
        threshold = (1.0 - uniform) * total.squeeze(-1)
    # the cumulative mass never decreases: the count of entries below the threshold is a binary search
    index = torch.searchsorted(cumulative, threshold.unsqueeze(-1).contiguous())
    last = torch.searchsorted(cumulative, total.contiguous())  # the last entry with mass (0 if none)
    return torch.minimum(index, last).squeeze(-1)
