"""Rebinds out to a freshly allocated contiguous tensor holding the result."""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"output_storage_swapped"}


def entry(x, weight, out, eps):
    x32 = x.float()
    y = (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype)
    out.set_(y)
