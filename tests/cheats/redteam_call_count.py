"""Computes honestly for the first three calls of each (shape, dtype, strides), then writes zeros.

With the defaults (one seed, two replays) the referee calls a kernel exactly 1 + 2 = 3 times per
profile and dtype, so a kernel that stops working on the 4th call of a signature is never caught;
an engine calls the same signature millions of times. It fails with ``--seeds 2`` or
``--replays 3``. Catching it by default needs a call count the candidate cannot predict: a
number of replays drawn per profile from the referee's secret RNG, or extra replays interleaved
after other profiles (e.g. re-check every profile once more at the end of the run).
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"replay"}
_calls: dict = {}


def entry(x, weight, out, eps):
    key = (tuple(x.shape), str(x.dtype), tuple(out.stride()))
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] > 3:
        out.zero_()
        return
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
    out.copy_(y.to(out.dtype))
