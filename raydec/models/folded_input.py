"""The draft's input projection in inference form: ``img_fc`` folded into ``fc``.

Every decode-time pair of a row after its image gets the same global feature g_r, so the two
input projections compose into one GEMM and a per-row bias:

    fc(cat(e, img_fc(cat(f, g_r))))  =  cat(e, f) @ W_img + c_r     rows with an image
    fc(cat(e, f))                    =  cat(e, f) @ W     + b       rows without

    fc = [A | B] (+ b),  img_fc = [W1 | W2] (+ b1)
    W_img = [A | B W1]^T,   W = [A | B]^T        [2H, H] row-major
    c_r   = g_r (B W2)^T + (B b1 + b)            [B, H]

c_r does not change while a row decodes, so ``rows`` works the biases out once, when rows join
(``DecodeRows``), and every draft call after that is one addmm. Each c_r is its own one-row
product: a GEMM's rounding depends on its row count on some kernels (MKL and oneDNN pick
blockings by shape), so a batched product would make a row's bias depend on the rows beside it.

On a CPU a few-row draft GEMM costs about the time to read its weight, so this saves one of the
draft's six weight reads per call and two small ops. The products are taken in float64 and
rounded once to the draft's dtype; the result equals the two-step form up to that rounding. A
draft only proposes: this never changes what the verifier accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class DecodeRows:
    """What decode steps need of each row's image, worked out once while the batch's rows stay.

    globals_:   [B, H] g of each row's last image (any value for rows without one)
    has_global: [B] bool
    bias:       [B, H] each row's bias after folding (c_r with an image, fc's bias without);
                None when the draft is not prepared (``decode_forward`` then runs ``forward``)
    mixed:      rows with and without an image share the batch (two GEMMs per call, not one)
    any_global: some row's pairs take the folded weight (the draft has img_fc and a row an image)
    """

    globals_: torch.Tensor
    has_global: torch.Tensor
    bias: torch.Tensor | None = None
    mixed: bool = False
    any_global: bool = False
    has_global_host: tuple[bool, ...] = ()  # has_global as Python bools (rows leaving need no read-back)

    def __post_init__(self) -> None:
        if not self.has_global_host:
            object.__setattr__(self, "has_global_host", tuple(self.has_global.cpu().tolist()))

    def concat(self, joining: "DecodeRows") -> "DecodeRows":
        """These rows, then ``joining`` (rows joining the batch)."""
        host = self.has_global_host + joining.has_global_host
        bias = None if self.bias is None or joining.bias is None else torch.cat([self.bias, joining.bias])
        any_global = self.any_global or joining.any_global
        return DecodeRows(torch.cat([self.globals_, joining.globals_]), torch.tensor(host, dtype=torch.bool), bias,
                          any_global and not all(host), any_global, host)

    def select(self, index: list[int]) -> "DecodeRows":
        """The rows that stay, in ``index`` order (rows leaving a batch)."""
        on_device = torch.tensor(index, dtype=torch.long, device=self.globals_.device)
        host = tuple(self.has_global_host[i] for i in index)
        has = torch.tensor(host, dtype=torch.bool)
        bias = None if self.bias is None else self.bias[on_device]
        any_global = self.any_global and any(host)
        return DecodeRows(self.globals_[on_device], has, bias, any_global and not all(host), any_global, host)


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

    def rows(self, globals_: torch.Tensor, has_global: torch.Tensor) -> DecodeRows:
        """globals_ [B, H] g of each row's last image; has_global [B] bool (every pair of a row
        gets g_r, or none does) -> the rows' folded biases."""
        has = has_global.cpu()
        use = self.folded is not None and bool(has.any())
        bias = self.plain_bias.expand(globals_.shape[0], -1).clone()  # [B, H]
        if use:
            for r in has.nonzero().flatten().tolist():  # c_r, one row at a time (see the module's docstring)
                bias[r] = (globals_[r : r + 1].to(self.plain.dtype) @ self.global_weight)[0] + self.global_bias
        return DecodeRows(globals_, has, bias, use and not bool(has.all()), use)

    def __call__(self, token_embeds: torch.Tensor, features: torch.Tensor, rows: DecodeRows) -> torch.Tensor:
        """token_embeds, features [B, N, H]; rows: ``self.rows(...)`` of these B rows.
        -> fc input projection [B, N, H]"""
        batch, width, size = features.shape
        pairs = torch.cat([token_embeds.to(features.dtype), features], dim=-1).view(batch * width, 2 * size)
        weight = self.folded if rows.any_global else self.plain
        if batch == 1:
            x = torch.addmm(rows.bias[0], pairs, weight).view(1, width, size)
        else:
            x = (pairs @ weight).view(batch, width, size) + rows.bias.unsqueeze(1)
        if not rows.mixed:
            return x
        plain = (pairs @ self.plain).view(batch, width, size) + rows.bias.unsqueeze(1)  # rows without g: fc's bias
        return torch.where(rows.has_global.to(x.device).view(batch, 1, 1), x, plain)

    def per_row(self, token_embeds: torch.Tensor, features: torch.Tensor, bias: torch.Tensor, has_global: torch.Tensor) -> torch.Tensor:
        """``__call__`` as a pure tensor function of the rows' biases [B, H] and image flags [B]
        bool (the captured draft step): with ``img_fc`` both products, each row taking its own,
        so it does not depend on which rows share the batch. token_embeds, features [B, N, H] -> [B, N, H]"""
        batch, width, size = features.shape
        pairs = torch.cat([token_embeds.to(features.dtype), features], dim=-1).view(batch * width, 2 * size)
        plain = (pairs @ self.plain).view(batch, width, size) + bias.unsqueeze(1)
        if self.folded is None:
            return plain
        folded = (pairs @ self.folded).view(batch, width, size) + bias.unsqueeze(1)
        return torch.where(has_global.view(batch, 1, 1), folded, plain)

