"""The ``moe.fused_experts`` entry built on the selective leaf."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernelslot.kernels.moe_block.fused_experts import fused_experts_forward, prepare_fused_experts
from kernelslot.kernels.experts_spec import ExpertActivation


def _explicit(x, ids, wts, w13, w2, act: ExpertActivation) -> torch.Tensor:
    out = torch.zeros(x.shape[0], w2.shape[1])
    inter = w2.shape[2]
    for m in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[m, k])
            if e < 0:
                continue
            gu = w13[e].float() @ x[m].float()
            g, u = gu[:inter], gu[inter:]
            if act.kind == "silu":
                a = F.silu(g) * u
            else:
                g, u = g.clamp(max=7.0), u.clamp(-7.0, 7.0)
                a = g * torch.sigmoid(1.702 * g) * (u + 1)
            out[m] += float(wts[m, k]) * (w2[e].float() @ a)
    return out


@pytest.mark.parametrize("act", [ExpertActivation("silu"), ExpertActivation.swigluoai()], ids=["silu", "swigluoai"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_experts_matches_explicit_loop_into_strided_out(act: ExpertActivation, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(4)
    e, hidden, inter, m, k = 5, 32, 16, 7, 3
    w13 = (torch.randn(e, 2 * inter, hidden, generator=g) / 4).to(dtype)
    w2 = (torch.randn(e, hidden, inter, generator=g) / 4).to(dtype)
    x = torch.randn(m, hidden, generator=g).to(dtype)
    ids = torch.randint(0, e, (m, k), generator=g)
    ids[2, 1] = -1
    wts = torch.rand(m, k, generator=g) * 2  # raw multipliers, rows need not sum to 1
    snap = (w13.clone(), w2.clone())
    prepared = prepare_fused_experts(w13, w2)
    out = torch.full((m, hidden + 8), float("nan"), dtype=dtype)[:, :hidden]
    assert fused_experts_forward(x, ids, wts, prepared, act, out) is None
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), _explicit(x, ids, wts, w13, w2, act), atol=tol, rtol=tol)
    assert torch.equal(w13, snap[0]) and torch.equal(w2, snap[1])


def test_all_ids_minus_one_gives_zeros() -> None:
    w13, w2 = torch.randn(2, 8, 4), torch.randn(2, 4, 4)
    out = torch.full((3, 4), float("nan"))
    fused_experts_forward(torch.randn(3, 4), torch.full((3, 2), -1), torch.ones(3, 2), prepare_fused_experts(w13, w2),
                          ExpertActivation(), out)
    assert torch.equal(out, torch.zeros(3, 4))


def test_prepare_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"w13 \(E, 2I, H\)"):
        prepare_fused_experts(torch.randn(2, 8, 4), torch.randn(2, 4, 3))
