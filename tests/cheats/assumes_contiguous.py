"""Writes through contiguous strides regardless of the output's real strides."""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"out_of_bounds_write", "poison_left"}


def entry(x, weight, out, eps):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
    flat = torch.as_strided(out, out.shape, y.contiguous().stride(), out.storage_offset())
    flat.copy_(y)
