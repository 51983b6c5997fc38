"""Computes once per output address and replays the cached result afterwards."""
import torch

SLOT = "activation.silu_and_mul"
CATCHES = {"replay"}
_cache = {}


def entry(x, out):
    key = (x.data_ptr(), out.data_ptr(), tuple(x.shape))
    if key not in _cache:
        d = x.shape[-1] // 2
        _cache[key] = (torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float()).to(out.dtype)
    out.copy_(_cache[key])
