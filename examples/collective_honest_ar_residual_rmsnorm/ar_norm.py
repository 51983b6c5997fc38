"""All-reduce + residual add + RMSNorm, fused in one entry (the norm reads the residual as stored)."""
import torch
import torch.distributed as dist


def ar_residual_rmsnorm(x, residual, weight, eps, out_norm, out_residual, group):
    acc = x.to(torch.float32, copy=True).contiguous()
    dist.all_reduce(acc, group=group)
    out_residual.copy_(acc + residual.float())
    y = out_residual.float()  # rounded to the output dtype, as the next layer reads it
    out_norm.copy_(y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * weight.float())
