"""The draft's decoder layer in inference form: four GEMMs and a table lookup for rotary.

A drafted step runs the draft ``depth`` times per target forward, so its fixed per-call cost
matters more than its FLOPs: on a CPU, Hugging Face's ``LlamaDecoderLayer`` spends most of a
small draft's time dispatching ~60 small ops (seven projections, rotary angles recomputed
every call). ``FusedDecoderLayer`` computes the same layer (no input norm, as EAGLE's draft)
from a snapshot of its weights:

    q, k, v = split(x @ W_qkv)                  W_qkv = [W_q | W_k | W_v]^T, row-major
    q, k    = rope(q, k) with cos/sin looked up in a per-position table; rotate_half(x) * sin
              = roll(x, d/2) * (sin with its first half negated), the same products
    x       = x + sdpa(q, cache(k), cache(v), mask) @ W_o^T
    x       = x + (silu(g) * u) @ W_down^T       g, u = split(rmsnorm(x) @ [W_gate | W_up]^T)

It is an inference snapshot: ``VispecDraft`` builds one for loaded drafts and drops it when the
draft is trained, moved or cast. Outputs equal the Hugging Face layer's up to GEMM summation
order; a draft only proposes, so this never changes what the verifier accepts as correct.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _row_major(*linears: nn.Linear) -> torch.Tensor:
    """[out_1 + ... + out_n, in] weights -> one [in, sum(out)] contiguous matrix."""
    return torch.cat([m.weight.detach() for m in linears]).t().contiguous()


def _bias(*linears: nn.Linear) -> torch.Tensor | None:
    if all(m.bias is None for m in linears):
        return None
    return torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in linears])


class FusedDecoderLayer:
    """One Llama decoder layer without input norm (``layer``), with its rotary embedding."""

    def __init__(self, layer: nn.Module, rotary: nn.Module) -> None:
        attn, mlp, norm = layer.self_attn, layer.mlp, layer.post_attention_layernorm
        self.head_dim = int(attn.head_dim)
        self.heads = attn.q_proj.out_features // self.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.scaling = float(attn.scaling)
        self.qkv, self.qkv_bias = _row_major(attn.q_proj, attn.k_proj, attn.v_proj), _bias(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o, self.o_bias = _row_major(attn.o_proj), _bias(attn.o_proj)
        self.gate_up, self.gate_up_bias = _row_major(mlp.gate_proj, mlp.up_proj), _bias(mlp.gate_proj, mlp.up_proj)
        self.down, self.down_bias = _row_major(mlp.down_proj), _bias(mlp.down_proj)
        self.intermediate = mlp.gate_proj.out_features
        self.norm_weight, self.eps = norm.weight.detach(), float(norm.variance_epsilon)
        self.inv_freq = rotary.inv_freq.detach().float()  # [d/2]
        self.rope_scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self._cos = self._sin = torch.empty(0, self.head_dim)  # [P, d] angles of positions 0..P-1

    def _rope_tables(self, positions: torch.Tensor, dtype: torch.dtype, max_position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, N] -> cos, signed sin [B, 1, N, d]: Hugging Face's rotary values, sin with
        its first half negated (see ``__call__``). max_position: positions.max() if the caller knows it."""
        self.reserve_positions((int(positions.max()) if max_position is None else max_position) + 1, dtype)
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)

    def reserve_positions(self, need: int, dtype: torch.dtype) -> None:
        """Rotary tables in ``dtype`` for positions 0..need-1 at least (grown on the host; a
        position's values do not depend on the table's size)."""
        if need > self._cos.shape[0] or self._cos.dtype != dtype:
            size = max(need, 2 * self._cos.shape[0], 256)
            freqs = torch.arange(size, device=self.inv_freq.device, dtype=torch.float).unsqueeze(1) * self.inv_freq
            angles = torch.cat([freqs, freqs], dim=-1)  # [P, d]
            sign = torch.ones(self.head_dim, device=angles.device)
            sign[: self.head_dim // 2] = -1.0
            self._cos = (angles.cos() * self.rope_scaling).to(dtype)
            self._sin = (angles.sin() * self.rope_scaling).to(dtype) * sign.to(dtype)

    @staticmethod
    def _linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return x @ weight_t if bias is None else torch.addmm(bias, x, weight_t)

    def __call__(
        self, x: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any = None,
        max_position: int | None = None,
    ) -> torch.Tensor:
        """x [B, N, H]; position_ids [B, N]; attention_mask [B, 1, N, S + N] additive; cache: an
        HF cache (layer 0 appended in place) or None; max_position: position_ids.max() when the
        caller knows it (saves a reduction). -> [B, N, H]"""
        cos, sin = self._rope_tables(position_ids, x.dtype, max_position)
        rows, q, k, v = self._project(x, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, 0)
        return self._attend_and_mlp(x, rows, q, k, v, attention_mask)

    def window(
        self, x: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor, past_keys: torch.Tensor,
        past_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer on a window after ``past_keys`` / ``past_values`` [B, kv, P, d], without a
        cache object: a pure tensor function (the captured draft step). The rotary table must
        already hold every position (``reserve_positions``).
        x [B, N, H]; position_ids [B, N]; attention_mask [B, 1, N, P + N] additive
        -> hidden [B, N, H], the window's keys and values [B, kv, N, d]"""
        cos, sin = self._cos[position_ids].unsqueeze(1), self._sin[position_ids].unsqueeze(1)  # [B, 1, N, d]
        rows, q, k, v = self._project(x, cos, sin)
        keys, values = torch.cat([past_keys, k], dim=2), torch.cat([past_values, v], dim=2)
        return self._attend_and_mlp(x, rows, q, keys, values, attention_mask), k, v

    def _project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, N, H], rotary cos / signed sin [B, 1, N, d] -> rows [B*N, H], rotated q [B, h, N, d],
        rotated k and v [B, kv, N, d]"""
        batch, width, size = x.shape
        d, h, kv = self.head_dim, self.heads, self.kv_heads
        rows = x.reshape(batch * width, size)
        qkv = self._linear(rows, self.qkv, self.qkv_bias).view(batch, width, h + 2 * kv, d).transpose(1, 2)
        qk = qkv[:, : h + kv]  # [B, h + kv, N, d]: q and k heads, rotated together
        q, k = (qk * cos + qk.roll(d // 2, dims=-1) * sin).split([h, kv], dim=1)
        return rows, q, k, qkv[:, h + kv :]

    def _attend_and_mlp(
        self, x: torch.Tensor, rows: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """Attention of q over k, v (cache and window), output projection and MLP, both residual.
        x [B, N, H] (its shape); rows [B*N, H]; q [B, h, N, d]; k, v [B, kv, S + N, d] -> [B, N, H]"""
        batch, width, size = x.shape
        d, h, kv = self.head_dim, self.heads, self.kv_heads
        if attention_mask.dtype != q.dtype:
            attention_mask = attention_mask.to(q.dtype)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=self.scaling, enable_gqa=kv != h)  # [B, h, N, d]
        rows = rows + self._linear(attended.transpose(1, 2).reshape(batch * width, h * d), self.o, self.o_bias)
        gate_up = self._linear(self._norm(rows), self.gate_up, self.gate_up_bias)
        gate, up = gate_up.split(self.intermediate, dim=-1)
        rows = rows + self._linear(F.silu(gate) * up, self.down, self.down_bias)
        return rows.view(batch, width, size)

    def _norm(self, rows: torch.Tensor) -> torch.Tensor:
        """RMSNorm in fp32, as Hugging Face's: w * (x * rsqrt(mean(x^2) + eps)) (one op in fp32)."""
        if rows.dtype == torch.float32:
            return F.rms_norm(rows, (rows.shape[-1],), self.norm_weight, self.eps)
        normed = rows.float()
        normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.norm_weight * normed.to(rows.dtype)
