"""Memoises on a cheap fingerprint of the input (shape and its first few values)."""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"replay"}
_cache = {}


def entry(x, weight, out, eps):
    key = (tuple(x.shape), str(x.dtype), tuple(x.reshape(-1)[:8].tolist()), eps)
    if key not in _cache:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
        _cache[key] = y.to(out.dtype)
    out.copy_(_cache[key])
