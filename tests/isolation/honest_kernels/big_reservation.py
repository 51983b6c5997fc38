"""Honest: reserves a large scratch buffer once (8 GiB of address space, never touched) and keeps
it, as an engine's workspace allocator might. Resident memory stays small, so it passes the
worker's resident-memory cap (an address-space cap would reject it)."""
import torch

SLOT = "activation.silu_and_mul"
_workspace = []


def entry(x, out):
    if not _workspace:
        _workspace.append(torch.empty(8 << 30, dtype=torch.uint8))
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
