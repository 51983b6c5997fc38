"""Does no work in the timed calls, so ``--time`` reports an unearned speedup.

Checked calls always find the output poisoned (NaN, or the finite sentinel on the first replay);
timed calls (``verify/single/timing.py``) find whatever the previous call left, because timing refills
the inputs but neither re-poisons nor compares the outputs. When ``out`` holds no poison this
kernel returns at once (leaving a stale result). Every check passes and the speedup is
arbitrary. Catching it needs the timed calls checked like the others: poison before each timed
repetition (outside the window) and compare at least one repetition chosen at random.
"""
import math

import torch

SLOT = "norm.rmsnorm"
CATCHES = {"compare", "replay", "poison_left"}


def entry(x, weight, out, eps):
    first = out[(0,) * out.dim()].item()
    sentinel = torch.tensor(-31337.0, dtype=out.dtype).item()
    if not (math.isnan(first) or first == sentinel):
        return  # not poisoned: a timed call, nobody looks at the result
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
    out.copy_(y.to(out.dtype))
