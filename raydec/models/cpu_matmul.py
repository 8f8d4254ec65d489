"""bfloat16 linear layers on CPUs without bfloat16 matrix instructions.

A bf16 GEMM multiplies bf16 operands, accumulates in fp32 and rounds the output to bf16. CPUs
with AVX512-BF16 or AMX do that in hardware; on the others PyTorch emulates it, and its cost
grows with every extra row: on a 2-core AVX2 machine a [33, 192] x [192, 576] product took
307 us in bf16 and 88 us in fp32, so a 10-token verification window cost 2.1x a one-token
forward of the reference VLM instead of 1.5x. That penalises exactly what speculative decoding
does: score many tokens in one forward.

``fp32_matmul_for_bf16(model)`` gives every bf16 ``nn.Linear`` of a loaded (inference) model an
fp32 copy of its weights and computes ``linear(x.float(), w32, b32).to(bfloat16)``: the same
arithmetic as a bf16 GEMM (products of bf16 values are exact in fp32, the sum is fp32, the
output is rounded to bf16), up to summation order. Weights, activations and every other op stay
bf16. ``load_pipeline`` applies it to CPU targets when the CPU lacks bf16 instructions, so AR,
every drafted method and Hugging Face's own ``generate`` on that model use the same kernels.
``RAYDEC_CPU_BF16_MATMUL=native`` turns it off (``fp32`` forces it).
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

ENV_VAR = "RAYDEC_CPU_BF16_MATMUL"  # auto | fp32 | native


@lru_cache(maxsize=1)
def cpu_has_bf16_matmul() -> bool:
    """True when the CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16; Linux flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # cannot tell: leave PyTorch's kernels alone
    return "avx512_bf16" in flags or "amx_bf16" in flags


def wants_fp32_matmul(device: str | torch.device | None, dtype: torch.dtype) -> bool:
    """Should a bf16 model on ``device`` compute its linear layers with fp32 kernels?"""
    mode = os.environ.get(ENV_VAR, "auto").lower()
    if mode not in ("auto", "fp32", "native"):
        raise ValueError(f"{ENV_VAR}={mode!r}: expected auto, fp32 or native")
    if dtype != torch.bfloat16 or torch.device(device or "cpu").type != "cpu" or mode == "native":
        return False
    return mode == "fp32" or not cpu_has_bf16_matmul()


class _Fp32Linear:
    """``forward`` of one bf16 Linear through an fp32 GEMM (see the module docstring)."""

    def __init__(self, module: nn.Linear) -> None:
        self.weight = module.weight.detach().float()
        self.bias = None if module.bias is None else module.bias.detach().float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight, self.bias).to(torch.bfloat16)


def fp32_matmul_for_bf16(model: nn.Module) -> int:
    """Route every bf16 ``nn.Linear`` of an inference model through fp32 GEMMs; returns how many.

    The fp32 weight copies are taken now: for a model that is not trained or moved afterwards.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.dtype == torch.bfloat16 and module.weight.device.type == "cpu":
            module.forward = _Fp32Linear(module)  # an instance attribute: state_dict and saving unchanged
            count += 1
    if count:
        logger.info("bf16 linear layers on a CPU without bf16 instructions: %d use fp32 GEMMs (%s=native turns this off)", count, ENV_VAR)
    return count
