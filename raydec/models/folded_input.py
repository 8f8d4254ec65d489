"""The draft's input projection in inference form: ``img_fc`` folded into ``fc``.

Every decode-time pair of a row after its image gets the same global feature g_r, so the two
input projections compose into one GEMM and a per-row bias:

    fc(cat(e, img_fc(cat(f, g_r))))  =  cat(e, f) @ W_img + c_r     rows with an image
    fc(cat(e, f))                    =  cat(e, f) @ W     + b       rows without

    fc = [A | B] (+ b),  img_fc = [W1 | W2] (+ b1)
    W_img = [A | B W1]^T,   W = [A | B]^T        [2H, H] row-major
    c_r   = g_r (B W2)^T + (B b1 + b)            [B, H]

On a CPU a few-row draft GEMM costs about the time to read its weight, so this saves one of the
draft's six weight reads per call and two small ops. The products are taken in float64 and
rounded once to the draft's dtype; the result equals the two-step form up to that rounding. A
draft only proposes: this never changes what the verifier accepts.
"""

from __future__ import annotations

import torch
from torch import nn


class FoldedDraftInput:
    """Inference snapshot of ``fc`` (and ``img_fc`` when the draft has one)."""

    def __init__(self, fc: nn.Linear, img_fc: nn.Linear | None) -> None:
        hidden = fc.out_features
        weight, bias = fc.weight.detach().double(), fc.bias.detach().double()  # [H, 2H], [H]
        a, b = weight[:, :hidden], weight[:, hidden:]
        dtype = fc.weight.dtype
        self.plain = weight.t().contiguous().to(dtype)  # [2H, H]
        self.plain_bias = bias.to(dtype)
        self.folded = self.global_weight = self.global_bias = None
        if img_fc is not None:
            w1, w2 = img_fc.weight.detach().double()[:, :hidden], img_fc.weight.detach().double()[:, hidden:]
            self.folded = torch.cat([a, b @ w1], dim=1).t().contiguous().to(dtype)  # [2H, H]
            self.global_weight = (b @ w2).t().contiguous().to(dtype)  # [H, H]
            self.global_bias = (b @ img_fc.bias.detach().double() + bias).to(dtype)  # [H]

    def __call__(self, token_embeds: torch.Tensor, features: torch.Tensor, globals_: torch.Tensor, has_global: torch.Tensor) -> torch.Tensor:
        """token_embeds, features [B, N, H]; globals_ [B, H] g of each row; has_global [B] bool
        (every pair of a row gets g_r or none does). -> fc input projection [B, N, H]"""
        batch, width, size = features.shape
        pairs = torch.cat([token_embeds.to(features.dtype), features], dim=-1).view(batch * width, 2 * size)
        if self.folded is None or not bool(has_global.any()):
            return torch.addmm(self.plain_bias, pairs, self.plain).view(batch, width, size)
        row_bias = torch.addmm(self.global_bias, globals_.to(features.dtype), self.global_weight)  # [B, H]
        if batch == 1:
            x = torch.addmm(row_bias, pairs, self.folded).view(1, width, size)
        else:
            x = (pairs @ self.folded).view(batch, width, size) + row_bias.unsqueeze(1)
        if bool(has_global.all()):
            return x
        plain = torch.addmm(self.plain_bias, pairs, self.plain).view(batch, width, size)
        return torch.where(has_global.to(x.device).view(batch, 1, 1), x, plain)
