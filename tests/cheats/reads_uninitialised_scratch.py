"""Accumulates into a workspace it never clears: ``torch.empty`` sized for the largest batch (32 MiB),
the accumulator a slice of it. Fresh pages from the kernel are zero, so in a fresh process (a
worker) this passes every time by luck; from an allocator's cache (the CUDA caching allocator, a
heap that kept freed memory) the workspace holds whatever was there before, and so do the outputs.

In a fresh worker only the repeat on poisoned scratch catches it (``determinism``,
tests/verify/test_state_steps.py); in a long-lived process whose heap already held NaN, as the
test process, a first call may fail already (compare, replay, poison_left).
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"determinism", "compare", "replay", "poison_left"}
WORKSPACE = 8 << 20  # float32 cells: 32 MiB, always fresh pages on glibc


def entry(x, weight, out, eps):
    acc = torch.empty(WORKSPACE, dtype=torch.float32)[: out.numel()].view(out.shape)  # assumed zero
    xf = x.float()
    acc += xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()
    out.copy_(acc)
