"""Linear layers of inference models on a CPU: row-major fp32 GEMMs.

Two things make PyTorch's own ``nn.Linear`` slow for speculative decoding on a CPU, and both
hurt exactly what it does, score several tokens in one forward:

- ``F.linear`` multiplies by the transposed weight ``[out, in]``. For 3 to ~32 rows, MKL's
  transposed-B path parallelises badly: on the 2-core reference machine a [10, 192] x
  [192, 576] product took 110 us that way and 16-23 us against the same weight stored
  row-major ``[in, out]``; one row and 64+ rows cost about the same either way.
- A bf16 GEMM multiplies bf16 operands, accumulates in fp32 and rounds to bf16. CPUs with
  AVX512-BF16 or AMX do that in hardware; on the others PyTorch emulates it and its cost grows
  with every row ([33, 192] x [192, 576]: 307 us in bf16, 88 us in fp32).

``route_cpu_linears(model, compute)`` gives every CPU ``nn.Linear`` a row-major copy of its
weight in ``compute`` precision and computes ``addmm(b, x, W^T)`` with it, cast back to the
layer's dtype. For a bf16 layer with fp32 compute that is the arithmetic of a bf16 GEMM
(products of bf16 values are exact in fp32, the sum is fp32, the output is rounded to bf16), up
to summation order; an fp32 layer computes the same product as before. Parameters, state dicts
and every other op are unchanged; the copies cost one more weight matrix per layer.

``load_target``, ``load_draft_model`` and the benchmarks' Hugging Face assistant apply it to CPU
models, so AR, every drafted method and Hugging Face's own ``generate`` use the same kernels.
``RAYDEC_CPU_MATMUL=native`` turns it off; ``fp32`` also routes bf16 layers on CPUs that have
bf16 instructions (``auto`` leaves those to the hardware).
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

ENV_VAR = "RAYDEC_CPU_MATMUL"  # auto | fp32 | native


@lru_cache(maxsize=1)
def cpu_has_bf16_matmul() -> bool:
    """True when the CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16; Linux flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # cannot tell: leave PyTorch's kernels alone
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_matmul_precision(device: str | torch.device | None, dtype: torch.dtype) -> torch.dtype | None:
    """The precision the linear layers of a ``dtype`` model on ``device`` should compute in
    through row-major GEMMs, or None to leave PyTorch's ``nn.Linear`` alone."""
    mode = os.environ.get(ENV_VAR, "auto").lower()
    if mode not in ("auto", "fp32", "native"):
        raise ValueError(f"{ENV_VAR}={mode!r}: expected auto, fp32 or native")
    if mode == "native" or torch.device(device or "cpu").type != "cpu":
        return None
    if dtype == torch.float32:
        return torch.float32
    if dtype == torch.bfloat16 and (mode == "fp32" or not cpu_has_bf16_matmul()):
        return torch.float32
    return None


class _RowMajorLinear:
    """``forward`` of one Linear as ``addmm(b, x, W^T)`` with a row-major copy of W."""

    def __init__(self, module: nn.Linear, compute: torch.dtype) -> None:
        self.weight_t = module.weight.detach().to(compute).t().contiguous()  # [in, out]
        self.bias = None if module.bias is None else module.bias.detach().to(compute)
        self.compute, self.out_dtype = compute, module.weight.dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(self.compute)  # [*, in]
        y = rows @ self.weight_t if self.bias is None else torch.addmm(self.bias, rows, self.weight_t)
        return y.view(*x.shape[:-1], y.shape[-1]).to(self.out_dtype)


def row_major_weight(module: nn.Module, compute: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(W^T [in, out], bias) of a Linear routed here with ``compute`` precision, else None."""
    forward = vars(module).get("forward")
    if isinstance(forward, _RowMajorLinear) and forward.compute == compute:
        return forward.weight_t, forward.bias
    return None


def route_cpu_linears(model: nn.Module, compute: torch.dtype = torch.float32) -> int:
    """Route every CPU ``nn.Linear`` of an inference model through row-major ``compute`` GEMMs;
    returns how many. The copies are taken now: for a model not trained or moved afterwards."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.device.type == "cpu" and "forward" not in vars(module):
            module.forward = _RowMajorLinear(module, compute)  # an instance attribute: saving unchanged
            count += 1
    if count:
        logger.info("%d CPU linear layers use row-major %s GEMMs (%s=native turns this off)", count, compute, ENV_VAR)
    return count


def route_if_cpu(model: nn.Module, device: str | torch.device | None, dtype: torch.dtype) -> bool:
    """``route_cpu_linears`` when ``cpu_matmul_precision`` says so; True when routed."""
    compute = cpu_matmul_precision(device, dtype)
    if compute is None:
        return False
    route_cpu_linears(model, compute)
    return True
