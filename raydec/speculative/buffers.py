"""A step buffer kept across decode steps.

A fresh [B, N, V] tensor per step costs its page faults on the CPU (glibc maps each allocation
this large afresh); on a GPU the caching allocator makes either free. A buffer is reused while
shape, dtype and device stay, and its contents never outlive the step that wrote them.
"""

from __future__ import annotations

import torch


class KeptBuffer:
    """One reusable tensor: ``get`` returns the kept one when it fits, else a new empty one."""

    def __init__(self) -> None:
        self._tensor: torch.Tensor | None = None

    def get(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        kept = self._tensor
        if kept is None or tuple(kept.shape) != tuple(shape) or kept.dtype != dtype or kept.device != device:
            kept = self._tensor = torch.empty(shape, dtype=dtype, device=device)
        return kept
