"""``attention.decode``'s Triton kernel under the referee, interpreted on CPU tensors."""
from __future__ import annotations

import pytest
import torch

from kernelslot.slots import get_slot
from tests.kernels.triton.support import NUMPY_WARNINGS, assert_verified, require_interpreter, verify_interpreted

require_interpreter()
from kernelslot.kernels.triton.attention import decode  # noqa: E402  (after the interpreter is chosen)

pytestmark = list(NUMPY_WARNINGS)
SLOT = "attention.decode"

# -1 holes, repeated ids, blocks past seq_len, an empty request, MQA with saturating logits.
FAST = [("single_request_single_token", torch.float32), ("single_request_single_token", torch.bfloat16),
        ("single_request_single_token", torch.float16), ("ragged_gqa_padded_ids", torch.bfloat16),
        ("empty_request_nonpow2", torch.float16), ("mqa_saturating_logits", torch.float32)]


@pytest.mark.parametrize(("profile", "dtype"), FAST, ids=[f"{p}-{d}".replace("torch.", "") for p, d in FAST])
def test_passes_the_referee(profile: str, dtype: torch.dtype) -> None:
    assert_verified(verify_interpreted(SLOT, decode, profiles=[profile], dtypes=[dtype]), 1)


@pytest.mark.slow
def test_passes_every_profile() -> None:
    """The MiniMax-M3 geometry too: 64 query heads over 4 kv heads, head dim 128, 128-token blocks."""
    profiles = get_slot(SLOT).profiles
    assert_verified(verify_interpreted(SLOT, decode, profiles=sorted({p.name for p in profiles})), len(profiles))
