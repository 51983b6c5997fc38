"""The shared expert vs its twin, gated and ungated, dense and MX."""
from __future__ import annotations

import pytest
import torch

from kernelslot.kernels.moe_block.config import SharedExpert
from kernelslot.kernels.moe_block.shared_expert import shared_expert_forward, shared_expert_reference
from kernelslot.kernels.experts_spec import ExpertActivation
from kernelslot.slots.moe_block import make_expert_weights


@pytest.mark.parametrize("fmt", ["dense", "mxfp8"])
@pytest.mark.parametrize("gated", [False, True])
def test_shared_expert_matches_twin(fmt: str, gated: bool) -> None:
    g = torch.Generator().manual_seed(6)
    w = make_expert_weights(fmt, 1, 64, 32, g, torch.float32, biases=True)
    gate = torch.randn(64, generator=g) / 8 if gated else None
    shared = SharedExpert(w, ExpertActivation.swigluoai(), gate)
    h = torch.randn(5, 64, generator=g)
    got = shared_expert_forward(shared, h)
    torch.testing.assert_close(got, shared_expert_reference(shared, h), atol=1e-5, rtol=1e-5)
    if gated:
        ungated = shared_expert_forward(SharedExpert(w, shared.activation), h)
        torch.testing.assert_close(got, ungated * torch.sigmoid(h @ gate).unsqueeze(1), atol=1e-5, rtol=1e-5)


def test_shared_expert_must_hold_one_expert() -> None:
    w = make_expert_weights("dense", 2, 64, 32, torch.Generator().manual_seed(0), torch.float32)
    with pytest.raises(ValueError, match="one expert"):
        SharedExpert(w, ExpertActivation())
