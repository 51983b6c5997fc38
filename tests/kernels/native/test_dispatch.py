"""The expert-leaf dispatcher: prepare attaches the native layout once, the leaves run on it
when the call is covered and fall back to torch otherwise, with the same results."""
from __future__ import annotations

import pytest
import torch

from kernelslot.formats import quantize_mx
from kernelslot.kernels import native
from kernelslot.kernels.moe_block import experts_dispatch, prepare_fused_experts
from kernelslot.kernels.experts_spec import ScalingMode
from kernelslot.kernels.moe_block.leaves import all_expert_experts, experts_reference, selective_experts
from kernelslot.kernels.moe_block.masking import routed_indicator
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights

pytestmark = pytest.mark.skipif(not native.native_status()[0], reason="native path unavailable")
ACT = ExpertActivation.swigluoai()


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = native.expert_mlp_native

    def wrapper(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)
    monkeypatch.setattr(native, "expert_mlp_native", wrapper)
    return calls


def _mx_weights(gen):
    gd, gs = quantize_mx(torch.randn(6, 128, 96, generator=gen), "fp4")
    dd, ds = quantize_mx(torch.randn(6, 96, 64, generator=gen), "fp4")
    return ExpertWeights("mxfp4", gd, dd, gs, ds, gate_up_bias=torch.randn(6, 128, generator=gen))


@pytest.mark.parametrize("mx_act_quant", [False, True])
@pytest.mark.parametrize("scaling", [ScalingMode.POST_SCALE, ScalingMode.NO_SCALE])
def test_leaves_use_attached_native_layout(spy, scaling, mx_act_quant):
    gen = torch.Generator().manual_seed(0)
    w = _mx_weights(gen)
    experts_dispatch.attach_fast_paths(w)
    h = torch.randn(5, 96, generator=gen)
    ids = torch.tensor([[0, 3], [5, -1], [1, 2], [3, 4], [-1, -1]])
    aff = torch.rand(5, 2, generator=gen)
    ref = experts_reference(w, h, ids, aff, ACT, scaling, mx_act_quant)
    sel = selective_experts(w, h, ids, aff, ACT, scaling, mx_act_quant)
    sheet = torch.zeros(5, 6).scatter_add_(1, ids.clamp(min=0), aff * (ids >= 0))
    coef_sheet = sheet if scaling is ScalingMode.POST_SCALE else routed_indicator(ids, 6)
    alle = all_expert_experts(w, h, ids, coef_sheet, ACT, scaling, mx_act_quant)
    assert len(spy) == 2
    tol = 2e-3 if mx_act_quant else 1e-5
    for got in (sel, alle):
        assert ((got - ref).norm() / ref.norm()).item() < tol


def test_fused_experts_prepare_attaches_once_and_unsupported_falls_back(spy):
    gen = torch.Generator().manual_seed(1)
    w = prepare_fused_experts(torch.randn(4, 64, 64, generator=gen), torch.randn(4, 64, 32, generator=gen))
    h, ids, aff = torch.randn(3, 64, generator=gen), torch.tensor([[0, 1], [2, 3], [1, -1]]), torch.rand(3, 2)
    selective_experts(w, h, ids, aff, ACT, ScalingMode.POST_SCALE)
    assert len(spy) == 1
    odd = prepare_fused_experts(torch.randn(2, 48, 40, generator=gen), torch.randn(2, 40, 24, generator=gen))
    out = selective_experts(odd, torch.randn(2, 40), torch.tensor([[0, 1], [1, -1]]), torch.rand(2, 2), ACT,
                            ScalingMode.POST_SCALE)
    assert len(spy) == 1 and out.shape == (2, 40)  # H=40 is outside the domain: torch leaf
    unprepared = ExpertWeights("dense", torch.randn(2, 64, 64), torch.randn(2, 64, 32))
    selective_experts(unprepared, h[:2], ids[:2] % 2, aff[:2], ACT, ScalingMode.POST_SCALE)
    assert len(spy) == 1  # never repacked per call
