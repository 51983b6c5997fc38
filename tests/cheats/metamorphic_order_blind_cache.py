"""Serves results from a cache keyed on cheap, order-blind checksums of its inputs (the byte sum of
each tensor): every refill the referee makes changes some sum, so it always recomputes there, but
a batch holding the same tokens in another order has the same checksums, and it returns the old
batch's rows in the old order. An engine reorders tokens between steps all the time.
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"metamorphic"}
_cache = {}


def entry(x, weight, out, eps):
    key = (tuple(x.shape), str(x.dtype), int(x.contiguous().view(torch.uint8).sum()),
           int(weight.contiguous().view(torch.uint8).sum()), float(eps))
    if key not in _cache:
        xf = x.float()
        _cache[key] = (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype)
    out.copy_(_cache[key])
