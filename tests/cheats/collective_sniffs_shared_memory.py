"""Honest only when its output lives in shared memory (the referee's tensors), lazy otherwise.

An engine's tensors are not shared; the referee's are. On the plain-output call the rank hands the
candidate private copies, so the lazy branch runs and is compared like any call.
"""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"replay"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def entry(x, out, group):
    acc = x.to(torch.float32, copy=True)
    if out.is_shared():
        dist.all_reduce(acc, group=group)
    out.copy_(acc)  # without the reduction: this rank's share only
