"""CPU linear layers through row-major fp32 GEMMs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raydec.models.cpu_matmul import ENV_VAR, cpu_has_bf16_matmul, cpu_matmul_precision, route_cpu_linears

torch.set_num_threads(1)


def _model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32, bias=False)).to(dtype)


def test_fp32_gemm_is_a_bf16_gemm_up_to_summation_order():
    model = _model(torch.bfloat16)
    x = torch.randn(5, 7, 64).to(torch.bfloat16)
    native = model(x)
    keys = set(model.state_dict())
    assert route_cpu_linears(model) == 2
    routed = model(x)
    assert routed.dtype == torch.bfloat16 and routed.shape == native.shape
    assert set(model.state_dict()) == keys  # checkpoints unchanged
    # both round an fp32 sum of exact bf16 products: at most an ulp or two apart, rarely apart at all
    assert torch.allclose(routed.float(), native.float(), rtol=2 ** -6, atol=2 ** -6)
    assert (routed != native).float().mean() < 0.05


@pytest.mark.parametrize("rows", [1, 4, 10, 64])
def test_row_major_fp32_gemm_computes_the_same_product(rows):
    model = _model(torch.float32)
    x = torch.randn(2, rows, 64)
    native = model(x)
    assert route_cpu_linears(model) == 2 and route_cpu_linears(model) == 0  # once per layer
    routed = model(x)
    assert routed.shape == native.shape and torch.allclose(routed, native, rtol=1e-5, atol=1e-5)
    assert model[0].forward.weight_t.is_contiguous() and model[0].forward.weight_t.shape == (64, 96)


def test_policy_follows_device_dtype_and_the_environment(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert cpu_matmul_precision("cpu", torch.float32) == torch.float32
    assert cpu_matmul_precision("cuda", torch.bfloat16) is None and cpu_matmul_precision("cuda", torch.float32) is None
    assert cpu_matmul_precision(None, torch.bfloat16) == (None if cpu_has_bf16_matmul() else torch.float32)
    assert cpu_matmul_precision("cpu", torch.float16) is None
    monkeypatch.setenv(ENV_VAR, "native")
    assert cpu_matmul_precision("cpu", torch.bfloat16) is None and cpu_matmul_precision("cpu", torch.float32) is None
    monkeypatch.setenv(ENV_VAR, "fp32")
    assert cpu_matmul_precision("cpu", torch.bfloat16) == torch.float32
    monkeypatch.setenv(ENV_VAR, "fast")
    with pytest.raises(ValueError, match=f"{ENV_VAR}='fast': expected auto, fp32 or native"):
        cpu_matmul_precision("cpu", torch.bfloat16)


def test_load_target_and_load_draft_model_route_the_reference_models_on_this_cpu(monkeypatch):
    from raydec.api import load_draft_model, load_target

    monkeypatch.setenv(ENV_VAR, "fp32")
    monkeypatch.setattr("raydec.models.loading._LOADED", {})  # a fresh load, not the shared one
    target = load_target("reference", "caption", dtype=torch.bfloat16)
    linears = [m for m in target.model.modules() if isinstance(m, nn.Linear)]
    assert target.cpu_matmul and linears and all("forward" in vars(m) for m in linears)
    draft_model = load_draft_model(target, "vispec", dtype=torch.float32)
    assert all("forward" in vars(m) for m in draft_model.modules() if isinstance(m, nn.Linear))
