"""Skips the cross-rank reduction: each rank writes its own residual + rmsnorm of its local x."""
import torch

SLOT = "collective.ar_residual_rmsnorm"
CATCHES = {"compare"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def entry(x, residual, weight, eps, out_norm, out_residual, group):
    s = x.float() + residual.float()
    out_residual.copy_(s)
    out_norm.copy_(s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps) * weight.float())
