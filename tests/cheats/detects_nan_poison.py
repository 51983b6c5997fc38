"""Behaves honestly only when it sees the harness's NaN poison in its output."""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"replay", "poison_left"}


def entry(x, weight, out, eps):
    if not torch.isnan(out).all():
        return  # "not under test": skip the work
    x32 = x.float()
    out.copy_(x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float())
