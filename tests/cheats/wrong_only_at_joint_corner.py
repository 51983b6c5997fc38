"""Honest unless a call holds more than 2^17 elements: a workspace sized for "the largest call".

Every fixed norm.rmsnorm profile, and every boundary that moves one size field, stays within
2^17 elements (the largest: 32 x 4096 and 64 x 2048); only a call with many tokens *and* a wide
hidden size, both near their verified maxima, overflows it, and then the rows past the workspace
are left at zero. A box-shaped verified envelope ([1, 64] tokens x [1, 4096] hidden) covered that
corner without any run there, and dispatch routed it. The corner profiles (one per pair of
extended fields, verify/envelope.py) run 64 x 4096 and fail it; without them the staircase the
receipt records has no run at that corner and routes nothing there
(tests/verify/test_envelope.py).
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"compare"}
DOMAIN: dict = {}  # any call (tests/test_cheats.py then runs every dtype)
OPTIONS = {"envelope": True, "plan_seed": 0}
WORKSPACE = 1 << 17  # elements


def entry(x, weight, out, eps):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
    rows = max(1, WORKSPACE // x.shape[-1])
    y[rows:] = 0  # rows that did not fit the workspace are never computed
    out.copy_(y.to(out.dtype))
