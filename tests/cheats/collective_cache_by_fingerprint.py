"""Caches the reduced result keyed by a fingerprint of the first input cells and the shape.

Replays that redraw every input miss the cache; the referee's partial replay keeps the leading
half of the input, so the stale result is returned and the comparison fails.
"""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"replay"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py

_CACHE = {}


def entry(x, out, group):
    key = (tuple(x.shape), float(x.reshape(-1)[0]), float(x.reshape(-1)[1]))
    if key not in _CACHE:
        acc = x.to(torch.float32, copy=True)
        dist.all_reduce(acc, group=group)
        _CACHE[key] = acc
    out.copy_(_CACHE[key])
