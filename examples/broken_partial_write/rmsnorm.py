"""Broken on purpose: forgets the last hidden element of every row (poison stays there)."""
import torch


def rmsnorm(x, weight, out, eps):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
    out[..., :-1].copy_(y[..., :-1])
