"""Memoises on a fingerprint of 16 cells spread evenly over the input (and the whole weight).

Full, head and tail refills each change some of the sampled cells, so the memo never serves a
stale answer under them. The sparse refills of the call plan (one random row, or 1-3 random
cells, of one input) leave a sample of s of n cells unchanged with probability about
``1 - s·w/n`` (w: cells changed), so the stale answer is served and fails the comparison.
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"replay"}
OPTIONS = {"plan_seed": 0}
_cache: dict = {}


def entry(x, weight, out, eps):
    flat = x.reshape(-1)
    sample = flat[:: max(1, flat.numel() // 16)][:16]
    key = (tuple(x.shape), str(x.dtype), tuple(sample.tolist()), tuple(weight.tolist()), eps)
    if key not in _cache:
        x32 = x.float()
        _cache[key] = (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype)
    out.copy_(_cache[key])
