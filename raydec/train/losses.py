"""Draft training losses (per supervised position; callers average them).

Stage 2 (ViSpec): ``l1_weight * |softmax(z) - p|_1 + listmle_weight * ListMLE_top(z; p)``.
Stage 1 (text-only EAGLE): ``feature_weight * SmoothL1(h, f) + ce_weight * (CE(z; p) + listmle_weight * ListMLE_top(z; p))``.

z: draft logits, p: target probabilities (softmax of the target's lm_head on its next hidden
state f), h: draft hidden state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raydec.train.config import LossConfig


def listmle_topk(draft_logits: torch.Tensor, target_probs: torch.Tensor, k: int = 10) -> torch.Tensor:
    """Top-k ListMLE (Xia et al. 2009): the negative log Plackett-Luce likelihood, under the draft's
    scores, of the target's k most likely tokens in the target's order, each picked from all tokens
    not yet placed. draft_logits, target_probs: [..., V] -> [...]"""
    k = min(k, draft_logits.shape[-1])
    order = target_probs.topk(k, dim=-1).indices  # [..., k] target's ranking
    scores = draft_logits.float()
    picked = scores.gather(-1, order)  # [..., k]
    # log of the mass left before step i: logsumexp over all tokens minus those placed at steps < i
    total = torch.logsumexp(scores, dim=-1, keepdim=True)  # [..., 1]
    placed = torch.logcumsumexp(picked, dim=-1)  # [..., k] logsumexp of the first i+1 picks
    before = torch.cat([torch.full_like(placed[..., :1], float("-inf")), placed[..., :-1]], dim=-1)
    # log(exp(total) - exp(before)), stably
    remaining = total + torch.log1p(-torch.exp(before - total).clamp(max=1 - 1e-6))
    return (remaining - picked).sum(-1)


def prob_l1(draft_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """|softmax(z) - p|_1 over the vocabulary. [..., V] -> [...]"""
    return (torch.softmax(draft_logits.float(), dim=-1) - target_probs).abs().sum(-1)


def soft_cross_entropy(draft_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """-sum p log softmax(z). [..., V] -> [...]"""
    return -(target_probs * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1)


def vispec_loss(draft_logits: torch.Tensor, target_probs: torch.Tensor, config: LossConfig) -> torch.Tensor:
    """Stage 2, per position. [..., V] -> [...]"""
    return config.l1_weight * prob_l1(draft_logits, target_probs) + config.listmle_weight * listmle_topk(
        draft_logits, target_probs, config.listmle_top
    )


def eagle_loss(
    draft_logits: torch.Tensor, target_probs: torch.Tensor, draft_hidden: torch.Tensor, target_hidden: torch.Tensor, config: LossConfig
) -> torch.Tensor:
    """Stage 1, per position. logits/probs [..., V]; hidden [..., H] -> [...]"""
    feature = F.smooth_l1_loss(draft_hidden.float(), target_hidden.float(), reduction="none").mean(-1)
    ranking = soft_cross_entropy(draft_logits, target_probs) + config.listmle_weight * listmle_topk(
        draft_logits, target_probs, config.listmle_top
    )
    return config.feature_weight * feature + config.ce_weight * ranking
