"""MoE finalize: gather each live token's K expert rows, scale, sum; all-reduce; + residual; RMSNorm."""
import torch
import torch.distributed as dist


def moe_finalize_ar_rmsnorm(gemm_out, row_map, scales, residual, weight, eps, out_norm, out_residual, group):
    t_exp, k = scales.shape
    t = residual.shape[0]
    partial = torch.zeros(t, gemm_out.shape[1], dtype=torch.float32)
    for j in range(k):  # row_map is K-major: expanded row of (token tok, slot j) is row_map[j * t_exp + tok]
        rows = row_map[j * t_exp: j * t_exp + t].long()
        partial += scales[:t, j:j + 1].float() * gemm_out[rows].float()
    dist.all_reduce(partial, group=group)
    out_residual.copy_(partial + residual.float())
    y = out_residual.float()
    out_norm.copy_(y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * weight.float())
