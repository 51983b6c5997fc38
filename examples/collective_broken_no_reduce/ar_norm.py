"""Broken: no all-reduce; each rank's output is its local x + residual, normalised."""
import torch


def ar_residual_rmsnorm(x, residual, weight, eps, out_norm, out_residual, group):
    out_residual.copy_(x.float() + residual.float())
    y = out_residual.float()
    out_norm.copy_(y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * weight.float())
