"""``activation.silu_and_mul``'s Triton kernel under the referee, interpreted on CPU tensors."""
from __future__ import annotations

import pytest
import torch

from kernelslot.slots import get_slot
from tests.kernels.triton.support import NUMPY_WARNINGS, assert_verified, require_interpreter, verify_interpreted

require_interpreter()
from kernelslot.kernels.triton.activation import silu_and_mul  # noqa: E402  (after the interpreter is chosen)

pytestmark = list(NUMPY_WARNINGS)
SLOT = "activation.silu_and_mul"

# The 3-D profile (an out whose leading dims cannot be viewed as one) in every dtype, one of each other kind.
FAST = [("leading_dims_3d", torch.float32), ("leading_dims_3d", torch.bfloat16), ("leading_dims_3d", torch.float16),
        ("ragged_rows_nonpow2", torch.bfloat16), ("saturating_large_values", torch.float16),
        ("single_token", torch.float32)]


@pytest.mark.parametrize(("profile", "dtype"), FAST, ids=[f"{p}-{d}".replace("torch.", "") for p, d in FAST])
def test_passes_the_referee(profile: str, dtype: torch.dtype) -> None:
    assert_verified(verify_interpreted(SLOT, silu_and_mul, profiles=[profile], dtypes=[dtype]), 1)


def test_a_four_dim_out_is_written_through_its_strides() -> None:
    x = torch.randn(2, 3, 4, 10, dtype=torch.bfloat16)
    base = torch.full((3, 4, 5, 8), float("nan"), dtype=torch.bfloat16)
    out = base[:2, :3, :4, :5]  # padded in every dim: no view of it has fewer dims
    silu_and_mul(x, out)
    want = torch.nn.functional.silu(x[..., :5].float()) * x[..., 5:].float()
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    assert base[..., 5:].isnan().all() and base[2:].isnan().all()  # the padding is untouched


@pytest.mark.slow
def test_passes_every_profile() -> None:
    profiles = get_slot(SLOT).profiles
    assert_verified(verify_interpreted(SLOT, silu_and_mul, profiles=sorted({p.name for p in profiles})), len(profiles))
