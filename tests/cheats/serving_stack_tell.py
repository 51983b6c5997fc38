"""Honest only when its caller's stack looks like the verification worker's (a frame of
kernelslot.isolation.child: the worker's request loop), wrong otherwise. Served from the executor
the stack is the same request path (serve -> handle -> _handle -> call -> _call_entry), so it is
honest; in-process it is wrong at call 1 and the first audit disables it.
``tests/dispatch/test_serving.py`` runs it."""
import sys

import torch

SLOT = "norm.rmsnorm"
SKIP_GENERIC = True  # a serving cheat: it passes verify by design


def _verifying() -> bool:
    f = sys._getframe(1)
    while f is not None:
        if f.f_globals.get("__name__", "").startswith(("kernelslot.isolation.child", "kernelslot.verify")):
            return True
        f = f.f_back
    return False


def entry(x, weight, out, eps):
    if not _verifying():
        out.zero_()
        return
    x32 = x.float()
    out.copy_((x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
