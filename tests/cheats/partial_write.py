"""Writes every row but the last: the poisoned last row must be noticed."""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"poison_left"}


def entry(x, weight, out, eps):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
    out[:-1].copy_(y[:-1])
    if out.shape[0] == 1:
        out[0, :-1].copy_(y[0, :-1])
