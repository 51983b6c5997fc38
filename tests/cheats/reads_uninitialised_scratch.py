"""Accumulates into a workspace it never clears: ``torch.empty`` sized for the largest batch (32 MiB),
the accumulator a slice of it. Fresh pages from the kernel are zero, so on the CPU this passes every
time by luck; from an allocator's cache (the CUDA caching allocator, a reused buffer, a smaller
size the heap serves) the workspace holds whatever was there before, and so do the outputs.
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"determinism"}
WORKSPACE = 8 << 20  # float32 cells: 32 MiB, always fresh pages on glibc


def entry(x, weight, out, eps):
    acc = torch.empty(WORKSPACE, dtype=torch.float32)[: out.numel()].view(out.shape)  # assumed zero
    xf = x.float()
    acc += xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()
    out.copy_(acc)
