"""Attention for decode windows of grouped-query models, without repeating K and V.

A decode step scores a window of new tokens (an SJD window, a draft tree) under our own 4-D mask.
With a mask, Hugging Face's SDPA path repeats every K/V head ``heads // kv_heads`` times
(``repeat_kv``) before attending: on Qwen2.5-VL-7B (28 query heads, 4 K/V heads) 7x the K/V
bytes of every forward, growing with the context. ``window_attention`` attends over the K/V heads
as they are:

- on a CPU, SDPA with ``enable_gqa=True``: its flash kernel takes the mask and reads each K/V head
  for its query group (no copy; the same outputs as repeating, to the bit, in float32 and bf16);
- elsewhere, the query heads of one K/V head become one longer query ([B, kv, group * N, D]) and
  the mask is repeated along it: the copy is the queries and the mask (N new tokens), never K/V
  (the context), and any SDPA kernel that takes a mask runs it.

One-token steps, models without grouped heads, and calls without a mask go to Hugging Face's
SDPA unchanged. ``use_window_attention(model)`` switches a loaded model to it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "raydec_window_sdpa"


def window_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query [B, H, N, D]; key, value [B, KV, S, D]; attention_mask [B, 1, N, >=S] (bool or additive)
    -> ([B, N, H, D], None), as Hugging Face's attention functions return."""
    batch, heads, new, dim = query.shape
    kv_heads = key.shape[1]
    if (
        heads == kv_heads or new == 1 or attention_mask is None or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1 or dropout > 0.0 or kwargs.get("softcap") is not None
        or kwargs.get("position_bias") is not None
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    mask = attention_mask[:, :, :, : key.shape[2]]
    if query.device.type == "cpu":
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True)
    else:
        group = heads // kv_heads  # query head h reads K/V head h // group (repeat_kv's order)
        packed = query.reshape(batch, kv_heads, group * new, dim)
        packed_mask = mask[:, :, None].expand(mask.shape[0], 1, group, new, mask.shape[-1]).reshape(mask.shape[0], 1, group * new, -1)
        out = F.scaled_dot_product_attention(packed, key, value, attn_mask=packed_mask, scale=scaling).view(batch, heads, new, dim)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, window_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_window_attention(model: torch.nn.Module) -> None:
    """Attend with ``window_attention`` in ``model`` and its sub-models (a vision tower's calls
    fall through to SDPA). Models that do not dispatch through Hugging Face's attention
    interface keep theirs."""
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None and getattr(model.config, "_attn_implementation", None) == "sdpa":
        setter(NAME)
