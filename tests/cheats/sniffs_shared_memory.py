"""Honest only while its input lives in shared memory (the worker runner's transport).

An engine hands a kernel ordinary private tensors; the referee's worker maps the referee's
tensors through shared memory, so ``x.untyped_storage().is_shared()`` tells the two apart. This
kernel writes zeros whenever its input is private. Caught because the call plan hands the
candidate private, non-shared copies on at least one compared call per profile (the plain
call; ``private=True`` in ``verify/plan.py``). In-process nothing is shared, so it fails there
at once.
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"compare", "replay"}


def entry(x, weight, out, eps):
    if not x.untyped_storage().is_shared():
        out.zero_()
        return
    x32 = x.float()
    out.copy_((x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
