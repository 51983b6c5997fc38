"""Broken on purpose: the slot passes (x, weight, out, eps); this takes eps from a default."""
import torch


def rmsnorm(x, weight, out):
    x32 = x.float()
    out.copy_(x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
