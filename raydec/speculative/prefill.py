"""The prefill window: per-row prompts left-padded into one batch, its attention mask, and the
first token each row samples from the prefill's P."""

from __future__ import annotations

from typing import Sequence

import torch

from raydec.speculative import random as streams
from raydec.speculative.random import RowRandom
from raydec.speculative.sampling import sample_with_uniform
from raydec.speculative.target import DecodingTarget, PromptInputs
from raydec.speculative.tree import identity_mask
from raydec.speculative.verify import coupled_tokens


def left_pad(prompts: Sequence[PromptInputs], target: DecodingTarget) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad per-row prefixes into one prefill window.

    returns inputs_embeds [M, L, H], position_ids [M, L] (or [P, M, L]), valid [M, L] bool,
    next_position [M], image_index [M, L] (-1 = text or padding)
    """
    rows, width = len(prompts), max(p.length for p in prompts)
    lengths = torch.tensor([p.length for p in prompts])
    valid = torch.arange(width).unsqueeze(0) >= (width - lengths).unsqueeze(1)  # [M, L]
    if prompts[0].input_ids is not None:
        ids = torch.zeros(rows, width, dtype=torch.long)
        ids[valid] = torch.cat([p.input_ids.long() for p in prompts])
        embeds = target.embed_prompt_tokens(ids)
    else:
        first = prompts[0].inputs_embeds
        embeds = torch.zeros(rows, width, first.shape[-1], dtype=target.dtype, device=target.device)
        embeds[valid.to(embeds.device)] = torch.cat([p.inputs_embeds.to(embeds) for p in prompts])
    if all(p.position_ids is None for p in prompts):
        position_ids = (torch.arange(width).unsqueeze(0) - (width - lengths).unsqueeze(1)).clamp(min=0)
    else:
        positions = []
        for p in prompts:
            pos = p.position_ids if p.position_ids is not None else torch.arange(p.length)
            pad = torch.zeros(*pos.shape[:-1], width - p.length, dtype=torch.long)
            positions.append(torch.cat([pad, pos.long()], dim=-1))
        position_ids = torch.stack(positions, dim=-2)  # [M, L] or [P, M, L]
    next_position = torch.tensor([p.next_position if p.next_position is not None else p.length for p in prompts])
    image_index = torch.full((rows, width), -1, dtype=torch.long)
    for i, p in enumerate(prompts):
        if p.image_index is not None:
            image_index[i, width - p.length :] = p.image_index
    return embeds, position_ids, valid, next_position, image_index


def pad_layer_residuals(prompts: Sequence[PromptInputs], valid: torch.Tensor, target: DecodingTarget) -> torch.Tensor | None:
    """The prompts' layer residuals in the prefill window's layout. valid [M, L] ->
    [K, M, L, H] (zero at padding and for prompts without any), or None when no prompt has any."""
    having = [p.layer_residuals for p in prompts if p.layer_residuals is not None]
    if not having:
        return None
    layers, size = having[0].shape[0], having[0].shape[-1]
    residuals = torch.zeros(layers, *valid.shape, size, dtype=target.dtype, device=target.device)
    width = valid.shape[1]
    for i, p in enumerate(prompts):
        if p.layer_residuals is not None:
            residuals[:, i, width - p.length :] = p.layer_residuals.to(residuals)
    return residuals


def prefill_mask(valid: torch.Tensor) -> torch.Tensor:
    """[M, L] valid -> [M, L, L] bool: causal over real tokens; padding sees only itself."""
    width = valid.shape[1]
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    allowed = causal.unsqueeze(0) & valid.unsqueeze(1)
    return allowed | identity_mask(width).unsqueeze(0)


def first_tokens(first_probs: torch.Tensor, random: RowRandom, coupled: list[bool]) -> torch.Tensor:
    """Each row's first token from the prefill's P ([B, V]): Gumbel-max with the noise of
    position 0 where coupled, inverse CDF with its first-token uniform elsewhere. -> [B]"""
    if not any(coupled):
        return sample_with_uniform(first_probs, random.uniforms(streams.FIRST_TOKEN, 1)[:, 0])
    gumbel = coupled_tokens(first_probs.unsqueeze(1), random.at_positions(torch.zeros_like(random.seeds)).exponentials(
        torch.zeros(1, dtype=torch.long), first_probs.shape[-1]))[:, 0]
    if all(coupled):
        return gumbel
    return torch.where(random.flags(), gumbel, sample_with_uniform(first_probs, random.uniforms(streams.FIRST_TOKEN, 1)[:, 0]))
