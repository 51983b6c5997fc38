"""Stage 1: residual add + RMSNorm, its twin, strided out_residual and bad input."""
from __future__ import annotations

import pytest
import torch

from kernelslot.kernels.moe_block.rmsnorm import residual_rmsnorm, residual_rmsnorm_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_matches_twin_and_fills_strided_residual(dtype: torch.dtype, with_residual: bool) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 64, generator=g).to(dtype)
    res = torch.randn(4, 64, generator=g).to(dtype) if with_residual else None
    gamma = (1 + 0.1 * torch.randn(64, generator=g)).to(dtype)
    out_res = torch.full((4, 80), float("nan"), dtype=dtype)[:, :64] if with_residual else None
    h = residual_rmsnorm(x, res, gamma, 1e-6, out_res)
    ref_h, ref_s = residual_rmsnorm_reference(x, res, gamma, 1e-6)
    assert h.dtype == torch.float32
    torch.testing.assert_close(h, ref_h, atol=1e-5, rtol=1e-5)
    if with_residual:
        assert torch.equal(out_res, ref_s)


def test_out_residual_without_residual_is_rejected() -> None:
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="residual is None"):
        residual_rmsnorm(x, None, torch.ones(8), 1e-6, torch.empty(2, 8))
