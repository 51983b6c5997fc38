"""Accumulates into a workspace it never clears: ``torch.empty`` sized for the largest batch (32 MiB),
the accumulator a slice of it, then all-reduces that. Fresh pages from the kernel are zero, so in a
fresh rank process this passes by luck; wherever the workspace comes from an allocator's cache it
holds whatever was there before, and so do the outputs.

In a rank only the calls on poisoned scratch catch it: the repeat of the previous call
(``determinism``: the outputs differ from the previous call's) and the extra replays that run on
poisoned scratch at random (``replay``).
"""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"determinism", "replay"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py
WORKSPACE = 8 << 20  # float32 cells: 32 MiB, always fresh pages on glibc


def entry(x, out, group):
    acc = torch.empty(WORKSPACE, dtype=torch.float32)[: x.numel()].view(x.shape)  # assumed zero
    acc += x.float()
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
