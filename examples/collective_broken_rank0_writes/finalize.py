"""Broken: every rank reduces, only group rank 0 writes (a "the leader writes" assumption)."""
import torch
import torch.distributed as dist


def moe_finalize_ar_rmsnorm(gemm_out, row_map, scales, residual, weight, eps, out_norm, out_residual, group):
    t_exp, k = scales.shape
    t = residual.shape[0]
    partial = torch.zeros(t, gemm_out.shape[1], dtype=torch.float32)
    for j in range(k):
        partial += scales[:t, j:j + 1].float() * gemm_out[row_map[j * t_exp: j * t_exp + t].long()].float()
    dist.all_reduce(partial, group=group)
    if dist.get_rank(group) != 0:
        return
    out_residual.copy_(partial + residual.float())
    y = out_residual.float()
    out_norm.copy_(y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * weight.float())
