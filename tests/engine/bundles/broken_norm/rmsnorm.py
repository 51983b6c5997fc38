"""Broken RMSNorm: applies (1 + w) to a weight that already holds it (a Gemma-convention mix-up)."""
import torch


def rmsnorm(x, weight, out, eps):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    out.copy_(y * (1.0 + weight.float()))
