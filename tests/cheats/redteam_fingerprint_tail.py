"""Memoises on a fingerprint of the *trailing* input cells, which every refill redraws.

The referee's partial refill redraws only the trailing half (in memory order) of the float
inputs, so a fingerprint of the last few cells changes on every replay: the memo never hits
under test and never serves a stale answer. In an engine, two calls whose inputs differ only in
their leading cells (e.g. the same last row) get the stale result. A fingerprint-collision probe
that keeps the *trailing* cells (or all but one random cell) would catch it.
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"replay"}
_cache: dict = {}


def entry(x, weight, out, eps):
    key = (tuple(x.shape), str(x.dtype), tuple(x.reshape(-1)[-8:].tolist()), tuple(weight[-4:].tolist()), eps)
    if key not in _cache:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
        _cache[key] = y.to(out.dtype)
    out.copy_(_cache[key])
