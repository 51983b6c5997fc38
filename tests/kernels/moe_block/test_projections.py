"""Gated activations vs their formula twins, clamps, and the MXFP8 activation round trip."""
from __future__ import annotations

import pytest
import torch

from kernelslot.kernels.moe_block.projections import gated_activation, gated_activation_reference, mxfp8_roundtrip
from kernelslot.kernels.experts_spec import ExpertActivation

ACTS = [
    ExpertActivation("silu"),
    ExpertActivation("swish", alpha=1.5),
    ExpertActivation("gelu"),
    ExpertActivation("gelu_tanh"),
    ExpertActivation.swigluoai(1.702, 7.0),
    ExpertActivation("silu", gate_clamp=(-2.0, None), up_clamp=(None, 1.0)),
]


@pytest.mark.parametrize("act", ACTS, ids=lambda a: f"{a.kind}-{a.gate_clamp}-{a.up_clamp}")
def test_gated_activation_matches_formula(act: ExpertActivation) -> None:
    g = torch.Generator().manual_seed(2)
    gate, up = torch.randn(3, 40, generator=g) * 6, torch.randn(3, 40, generator=g) * 6
    torch.testing.assert_close(gated_activation(gate, up, act), gated_activation_reference(gate, up, act),
                               atol=1e-5, rtol=1e-5)


def test_swigluoai_clamps_and_up_bias() -> None:
    act = ExpertActivation.swigluoai(1.702, 7.0)
    gate, up = torch.tensor([[10.0, -10.0]]), torch.tensor([[10.0, -10.0]])
    got = gated_activation(gate, up, act)
    sig = torch.sigmoid(torch.tensor(1.702 * 7.0))
    torch.testing.assert_close(got[0, 0], 7.0 * sig * (7.0 + 1.0))  # gate capped at 7, up at 7, +1
    torch.testing.assert_close(got[0, 1], -10.0 * torch.sigmoid(torch.tensor(-17.02)) * (-7.0 + 1.0))  # no lower gate clamp


def test_lower_gate_clamp_is_honoured() -> None:  # the seed's bf16 path ignores it; we do not
    act = ExpertActivation("silu", gate_clamp=(-1.0, None))
    got = gated_activation(torch.tensor([[-5.0]]), torch.tensor([[1.0]]), act)
    torch.testing.assert_close(got, torch.nn.functional.silu(torch.tensor([[-1.0]])))


def test_mxfp8_roundtrip_is_exact_on_representable_values_and_blocks_by_32() -> None:
    x = torch.tensor([[1.0, -2.0, 0.5, 448.0] * 8])
    assert torch.equal(mxfp8_roundtrip(x), x)
    y = torch.randn(2, 64)
    assert (mxfp8_roundtrip(y) - y).abs().max() <= y.abs().max() / 8
    with pytest.raises(ValueError, match="divisible by 32"):
        mxfp8_roundtrip(torch.randn(2, 40))
