"""Honest for the first 8 calls of each (shape, dtype, strides), then writes zeros.

Today's fixed schedule made 5 calls per profile (7 for a bundle); any fixed schedule of N calls is
beaten by a kernel honest for N. The call plan draws the number of extra replays from a geometric
distribution (``verify/plan.py``): with base replays R = 3 and mean m, a profile makes ``5 + X``
calls with ``P(X >= k) = q^k``, ``q = m/(1+m)``, so a kernel honest for N calls is caught on one
profile with probability ``q^(N-4)``, and over P profile runs of distinct signatures with
``1 - (1 - q^(N-4))^P`` (here m = 2, N = 8, P = 18 rmsnorm runs: 0.9996; the test pins the plan seed).
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"replay"}
OPTIONS = {"extra_mean": 2.0, "plan_seed": 0}  # a bundle's plan (see tests/test_cheats.py)
_calls: dict = {}


def entry(x, weight, out, eps):
    key = (tuple(x.shape), str(x.dtype), tuple(out.stride()))
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] > 8:
        out.zero_()
        return
    x32 = x.float()
    out.copy_((x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
