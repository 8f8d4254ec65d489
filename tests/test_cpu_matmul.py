"""bf16 linear layers through fp32 GEMMs on CPUs without bf16 instructions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raydec.models.cpu_matmul import ENV_VAR, cpu_has_bf16_matmul, fp32_matmul_for_bf16, wants_fp32_matmul

torch.set_num_threads(1)


def test_fp32_gemm_is_a_bf16_gemm_up_to_summation_order():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32, bias=False)).to(torch.bfloat16)
    x = torch.randn(5, 7, 64).to(torch.bfloat16)
    native = model(x)
    keys = set(model.state_dict())
    assert fp32_matmul_for_bf16(model) == 2
    routed = model(x)
    assert routed.dtype == torch.bfloat16 and set(model.state_dict()) == keys  # checkpoints unchanged
    # both round an fp32 sum of exact bf16 products: at most an ulp or two apart, rarely apart at all
    assert torch.allclose(routed.float(), native.float(), rtol=2 ** -6, atol=2 ** -6)
    assert (routed != native).float().mean() < 0.05


def test_policy_follows_device_dtype_and_the_environment(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert not wants_fp32_matmul("cpu", torch.float32) and not wants_fp32_matmul("cuda", torch.bfloat16)
    assert wants_fp32_matmul(None, torch.bfloat16) == (not cpu_has_bf16_matmul())
    monkeypatch.setenv(ENV_VAR, "native")
    assert not wants_fp32_matmul("cpu", torch.bfloat16)
    monkeypatch.setenv(ENV_VAR, "fp32")
    assert wants_fp32_matmul("cpu", torch.bfloat16)
    monkeypatch.setenv(ENV_VAR, "fast")
    with pytest.raises(ValueError, match=f"{ENV_VAR}='fast': expected auto, fp32 or native"):
        wants_fp32_matmul("cpu", torch.bfloat16)


def test_load_pipeline_routes_a_bf16_reference_model_on_this_cpu(monkeypatch):
    from raydec.api import load_pipeline

    monkeypatch.setenv(ENV_VAR, "fp32")
    monkeypatch.setattr("raydec.api._PIPELINES", {})  # a fresh load, not the shared one
    target = load_pipeline("reference", "vlm", dtype=torch.bfloat16)
    linears = [m for m in target.model.modules() if isinstance(m, nn.Linear)]
    assert target.fp32_matmul and linears and all("forward" in vars(m) for m in linears)
