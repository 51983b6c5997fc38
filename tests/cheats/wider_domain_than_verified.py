"""Declares every token count but is honest only up to the largest profiled one (32 rows).

A pass used to cover the whole declared domain, so live routing would hand this kernel a
4096-token prefill nobody verified. With the verified envelope (``verify/envelope.py``) the
referee runs boundary profiles at the domain's limits (here: no upper limit, so twice the largest
profiled value and one value between), and this kernel fails there; a kernel that is right there
passes with its envelope recorded, and dispatch routes only inside declared ∩ verified.
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"compare"}
DOMAIN: dict = {}  # any call (tests/test_cheats.py then runs every dtype)
OPTIONS = {"envelope": True, "plan_seed": 0}


def entry(x, weight, out, eps):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
    if x.shape[0] > 32:
        y[32:] = 0  # "nobody calls it with more"
    out.copy_(y.to(out.dtype))
