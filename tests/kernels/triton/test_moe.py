"""``moe.fused_experts``' Triton kernels under the referee, interpreted on CPU tensors (dense and NVFP4)."""
from __future__ import annotations

import pytest
import torch

from kernelslot.slots import get_slot
from tests.kernels.triton.support import NUMPY_WARNINGS, assert_verified, require_interpreter, verify_interpreted

require_interpreter()
from kernelslot.kernels.triton import moe  # noqa: E402  (after the interpreter is chosen)

pytestmark = list(NUMPY_WARNINGS)
SLOT = "moe.fused_experts"

# -1 ids (one token routed nowhere) and raw weights in every dtype; the NVFP4 prepare form with
# swigluoai (its clamps: test_experts.py). The other profiles are in the slow test.
FAST = [("decode_t1_ep_minus_one", torch.float32), ("decode_t1_ep_minus_one", torch.bfloat16),
        ("decode_t1_ep_minus_one", torch.float16), ("minimax_nvfp4", torch.bfloat16)]


def entry_for(profile: str):
    return moe.fused_experts_swigluoai if profile.startswith("minimax") else moe.fused_experts_silu


@pytest.mark.parametrize(("profile", "dtype"), FAST, ids=[f"{p}-{d}".replace("torch.", "") for p, d in FAST])
def test_passes_the_referee(profile: str, dtype: torch.dtype) -> None:
    assert_verified(verify_interpreted(SLOT, entry_for(profile), moe.prepare, profiles=[profile], dtypes=[dtype]), 1)


def test_prepare_references_dense_weights_and_rejects_other_shapes() -> None:
    w13, w2 = torch.randn(3, 8, 16), torch.randn(3, 16, 4)
    weights = moe.prepare(w13, w2)
    assert weights.gate_up is w13 and weights.down is w2 and weights.format == "dense"
    with pytest.raises(ValueError, match=r"w13 \(E, 2I, H\)"):
        moe.prepare(w13, torch.randn(3, 16, 5))


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
def test_passes_every_profile(activation: str) -> None:
    """The generic profiles on the SiLU entry, the MiniMax-M3 ones (swigluoai, NVFP4) on the swigluoai entry."""
    profiles = [p for p in get_slot(SLOT).profiles if (p.model == "MiniMax-M3") == (activation == "swigluoai")]
    entry = moe.fused_experts_swigluoai if activation == "swigluoai" else moe.fused_experts_silu
    report = verify_interpreted(SLOT, entry, moe.prepare, profiles=sorted({p.name for p in profiles}))
    assert_verified(report, len(profiles))
