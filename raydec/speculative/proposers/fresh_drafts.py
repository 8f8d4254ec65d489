"""The window of an SJD step: the pending drafts, then fresh drafts for the slots never predicted.

A fresh draft is a uniform random allowed token (its Q uniform over the allowed ids), or a copy
of the token to the left / above in the image grid (a spatial prior, its Q one-hot), and a forced
layout token is drafted as itself (Q one-hot). Tensor work alone, on the target's device, with
each row's uniforms given: ``JacobiProposer`` runs it eagerly or inside its captured window.
"""

from __future__ import annotations

from typing import Callable

import torch


def fill_window(
    pending_tokens: torch.Tensor, pending_q: torch.Tensor, have: torch.Tensor, lengths: torch.Tensor, tail: torch.Tensor,
    uniforms: torch.Tensor, allowed: torch.Tensor, allowed_ids: torch.Tensor, uniform_q: torch.Tensor, *, forced: Callable | None,
    in_place: bool = True, draws: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pending drafts, then fresh ones, for slots 1..S (module docstring).

    pending_tokens [B, S], pending_q [B, S, V] (written over when ``in_place``), have [B]: the
    pending drafts and how many are real; lengths [B]: committed tokens per row; tail [B, offset]:
    the last ``offset`` committed tokens for a spatial prior (offset 0: uniform draws); uniforms
    [B, S]; allowed [V] bool, allowed_ids [A], uniform_q [V]; forced: the constraint's forced
    tokens (None: none); draws: [B, S] allowed ids to take instead of the uniforms' draws (the
    coupled rows' Gumbel-max draws from the uniform Q)  -> tokens [B, S], Q [B, S, V]
    """
    batch, slots = pending_tokens.shape
    device = pending_tokens.device
    offset = tail.shape[1]
    fresh = have.unsqueeze(1) <= torch.arange(slots, device=device)                   # [B, S]
    tokens = torch.where(fresh, 0, pending_tokens)
    mask = fresh.unsqueeze(2)
    proposals = pending_q.masked_fill_(mask, 0.0) if in_place else pending_q.masked_fill(mask, 0.0)  # the precision P and the verifier use

    gen_index = lengths.unsqueeze(1) - 1 + torch.arange(1, slots + 1, device=device).unsqueeze(0)   # [B, S]
    forced_tokens = forced(gen_index).to(device) if forced is not None else None
    # a uniform allowed id: the floor(u * n)-th of the n allowed ids
    random_tokens = allowed_ids[(uniforms * len(allowed_ids)).long().clamp(max=len(allowed_ids) - 1)]  # [B, S]
    if draws is not None:
        random_tokens = draws
    is_forced = fresh & (forced_tokens >= 0) if forced_tokens is not None else torch.zeros_like(fresh)
    window = torch.where(is_forced, forced_tokens, tokens) if forced_tokens is not None else tokens   # [B, S]
    if not offset:  # no slot copies another: every fresh slot at once
        tokens = torch.where(fresh & ~is_forced, random_tokens, window)
        return tokens, set_fresh_proposals(proposals, tokens, is_forced, fresh & ~is_forced, uniform_q)
    # Spatial priors: slot s copies the token `offset` places before it: committed token
    # L - offset + s while s < offset, else window slot s - offset. A copy that is not an allowed
    # id falls back to the random draw. On the sequence [last `offset` committed | window], index
    # i copies i - offset, so the copies run along chains of stride `offset` and every slot takes
    # the token of the last *source* on its chain: a committed token, a pending or forced draft,
    # or a fallback. A fallback follows a committed / pending / forced token that is not allowed
    # (or missing); copies and fallbacks are allowed ids, so nothing else falls back.
    tail_valid = tail >= 0
    tail = tail.clamp(min=0)
    fixed = ~fresh | is_forced                                                          # [B, S]
    # slot s copies sequence index s: a tail token, or window slot s - offset
    copied_fixed = torch.cat([torch.ones(batch, offset, dtype=torch.bool, device=device), fixed], dim=1)[:, :slots]
    copied_ok = torch.cat([tail_valid & allowed[tail], allowed[window]], dim=1)[:, :slots]
    fallback = fresh & ~is_forced & copied_fixed & ~copied_ok                           # [B, S]
    window = torch.where(fallback, random_tokens, window)
    # forward fill along each chain: sequence index i = step * offset + residue
    steps = -(-(offset + slots) // offset)
    pad = steps * offset - offset - slots
    sequence = torch.cat([tail, window, torch.zeros(batch, pad, dtype=torch.long, device=device)], dim=1).view(batch, steps, offset)
    source = torch.cat(
        [torch.ones(batch, offset, dtype=torch.bool, device=device), fixed | fallback, torch.zeros(batch, pad, dtype=torch.bool, device=device)], dim=1
    ).view(batch, steps, offset)
    step = torch.arange(steps, device=device).view(1, steps, 1)
    last_source = torch.where(source, step, -1).cummax(dim=1).values                   # >= 0: step 0 is the tail
    filled = sequence.gather(1, last_source).view(batch, -1)[:, offset : offset + slots]
    tokens = torch.where(fresh, filled, tokens)
    return tokens, set_fresh_proposals(proposals, tokens, fresh & ~fallback, fresh & fallback, uniform_q)  # copies, forced: one-hot


def set_fresh_proposals(
    proposals: torch.Tensor, tokens: torch.Tensor, one_hot: torch.Tensor, uniform: torch.Tensor, uniform_q: torch.Tensor
) -> torch.Tensor:
    """Q of fresh slots in ``proposals`` ([B, S, V], zero at those slots), in place: one-hot at
    the slot's token where ``one_hot`` ([B, S]), ``uniform_q`` ([V]) where ``uniform`` (disjoint
    from ``one_hot``). Both are added to zeros, so each is exact."""
    proposals.scatter_add_(2, tokens.unsqueeze(2), one_hot.unsqueeze(2).to(proposals.dtype))
    return proposals.addcmul_(uniform.unsqueeze(2).to(proposals.dtype), uniform_q.to(proposals.dtype))
