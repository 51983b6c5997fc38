"""``moe.block_tkg`` with Triton expert leaves under the referee, interpreted on CPU tensors."""
from __future__ import annotations

import pytest
import torch

from kernelslot.slots import get_slot
from tests.kernels.triton.support import NUMPY_WARNINGS, assert_verified, require_interpreter, verify_interpreted

require_interpreter()
from kernelslot.kernels.triton import moe_block  # noqa: E402  (after the interpreter is chosen)

pytestmark = list(NUMPY_WARNINGS)
SLOT = "moe.block_tkg"

# The selective leaf; the all-expert leaf on an expert-parallel slice under NO_SCALE with tanh-GELU and a
# gated shared expert; MXFP4 weights with biases and the MXFP8 activation rounding. The other formats
# (fp8_row, mxfp8, nvfp4) are in test_experts.py and the slow test.
FAST = [("t1_selective_dense", torch.bfloat16), ("t5_no_scale_gelu_tanh_shared", torch.bfloat16),
        ("t16_all_expert_ep_mxfp4", torch.bfloat16)]


@pytest.mark.parametrize(("profile", "dtype"), FAST, ids=[f"{p}-{d}".replace("torch.", "") for p, d in FAST])
def test_passes_the_referee(profile: str, dtype: torch.dtype) -> None:
    report = verify_interpreted(SLOT, moe_block.moe_block_tkg, moe_block.prepare, profiles=[profile], dtypes=[dtype])
    assert_verified(report, 1)


@pytest.mark.slow
def test_passes_every_profile() -> None:
    """Every format (dense, fp8_row, mxfp4, mxfp8, nvfp4), model and skewed routing of the slot."""
    profiles = get_slot(SLOT).profiles
    report = verify_interpreted(SLOT, moe_block.moe_block_tkg, moe_block.prepare, profiles=sorted({p.name for p in profiles}))
    assert_verified(report, len(profiles))
