"""Honest for the first 40 calls of each (shape, dtype, strides) of its input, then writes zeros:
``honest_for_n_calls.py`` with N = 40, past anything the geometric extra replays reach (``q^(N-4-S)``
per profile run: (2/3)^34 = 1e-6 for a bundle's plan on norm.rmsnorm, S = 2).

What catches it is the long run (``verify/plan.py``, ``long_run``; on for bundles, ``BUNDLE_LONG_RUN``
= (16, 256)): one profile run per slot gets ``L`` more extra replays, ``L`` log-uniform in [16, 256], so
that run makes ``5 + S + X + L`` calls of one signature (the plain call's input has the same strides).
Caught when ``X + L >= N - 4 - S = 34``: ``P(L >= 34) = ln(257/34) / ln(257/16) = 0.73``, 0.75 with
the geometric ``X`` added, per slot verification. The generic test pins a plan seed whose long run is
long enough; ``tests/verify/test_long_run.py`` shows it passing without the long run and the
distribution behind the probability.
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"replay"}
OPTIONS = {"extra_mean": 2.0, "long_run": (16, 256), "plan_seed": 0}  # a bundle's plan (see tests/test_cheats.py)
HONEST_CALLS = 40
_calls: dict = {}


def entry(x, weight, out, eps):
    key = (tuple(x.shape), str(x.dtype), tuple(x.stride()))
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] > HONEST_CALLS:
        out.zero_()
        return
    x32 = x.float()
    out.copy_((x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
