"""Built-in collective kernels: the incumbents of the ``collective.*`` slots and ``moe.fused_experts_reduce``.

Contract (docs/slots/collective.md): every entry takes the process ``group`` it must
reduce over as its last argument and uses *only* that group (never the default world group,
never a group of its own, never rank/world size from the environment). Outputs are written in
place honouring their strides and dtype; entries return None.

Numeric convention: every cross-rank sum is computed in fp32 on a contiguous scratch buffer
(gloo and NCCL need dense tensors), whatever the I/O dtype, and the result is cast once into
the output. RMSNorm is ``y·rsqrt(mean(y², -1) + eps)·weight`` in fp32 on the residual as rounded
to the output dtype (what the next layer reads).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from kernelslot.kernels.moe_block import ExpertActivation, ExpertWeights, fused_experts_forward, prepare_fused_experts

__all__ = ["all_reduce", "ar_residual_rmsnorm", "moe_finalize_ar_rmsnorm", "prepare_fused_experts_reduce",
           "fused_experts_reduce", "GENERIC_ACTIVATION"]

GENERIC_ACTIVATION = ExpertActivation("silu")  # the generic model profile's expert activation


def _summed_fp32(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``Σ_group x`` as a fresh contiguous fp32 tensor."""
    acc = x.to(torch.float32, copy=True).contiguous()
    dist.all_reduce(acc, op=dist.ReduceOp.SUM, group=group)
    return acc


def _residual_rmsnorm(summed: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      out_norm: torch.Tensor, out_residual: torch.Tensor) -> None:
    out_residual.copy_(summed + residual.float())
    y = out_residual.float()
    out_norm.copy_(y * torch.rsqrt(y.square().mean(dim=-1, keepdim=True) + eps) * weight.float())


def all_reduce(x: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``out = Σ_group x``."""
    out.copy_(_summed_fp32(x, group))


def ar_residual_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                        out_norm: torch.Tensor, out_residual: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``out_residual = Σ_group x + residual``; ``out_norm = rmsnorm(out_residual)·weight``."""
    _residual_rmsnorm(_summed_fp32(x, group), residual, weight, eps, out_norm, out_residual)


def moe_finalize_ar_rmsnorm(gemm_out: torch.Tensor, row_map: torch.Tensor, scales: torch.Tensor,
                            residual: torch.Tensor, weight: torch.Tensor, eps: float, out_norm: torch.Tensor,
                            out_residual: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Gather K-major rows, scale and sum them, all-reduce, add the residual and normalise.

    ``partial[t] = Σ_k scales[t,k]·gemm_out[row_map[k·T_exp + t]]`` for the live ``t < T``
    (``T = residual.shape[0] <= T_exp``); only the live rows travel through the all-reduce.
    """
    t_exp, k = scales.shape
    t = residual.shape[0]
    rows = row_map.long().view(k, t_exp)[:, :t]  # (K, T) K-major
    picked = gemm_out.float()[rows]  # (K, T, H)
    partial = (picked * scales.float()[:t].t().unsqueeze(-1)).sum(dim=0)
    _residual_rmsnorm(_summed_fp32(partial, group), residual, weight, eps, out_norm, out_residual)


def prepare_fused_experts_reduce(w13: torch.Tensor, w2: torch.Tensor) -> ExpertWeights:
    """This rank's dense expert weights (an I-slice of every expert, or a shard of experts)."""
    return prepare_fused_experts(w13, w2)


def fused_experts_reduce(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                         prepared: ExpertWeights, out: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``out = Σ_group`` (this rank's ``moe.fused_experts`` result); ids ``-1`` contribute nothing."""
    local = torch.empty(out.shape, dtype=torch.float32, device=out.device)
    fused_experts_forward(x, topk_ids, topk_weights, prepared, GENERIC_ACTIVATION, local)
    dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
    out.copy_(local)
