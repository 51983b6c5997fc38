"""The built-in ``moe.fused_experts`` computation, on the block's selective leaf.

Contract (``moe.fused_experts``, docs/slots/moe.md): ``x (M, H)``; ``topk_ids (M, K)`` expert ids in
``[0, E)`` or ``-1`` (contributes nothing); ``topk_weights (M, K)`` fp32 raw multipliers
applied as given (POST_SCALE, no renormalisation); ``out[m] = Σ_k w[m,k]·expert_e(x[m])``,
computed in fp32 and written into ``out`` honouring its strides and dtype.
"""
from __future__ import annotations

import torch

from kernelslot.kernels.moe_block.config import ScalingMode
from kernelslot.kernels.moe_block.experts_dispatch import attach_fast_paths
from kernelslot.kernels.moe_block.leaves import selective_experts
from kernelslot.kernels.moe_block.spec import ExpertActivation, ExpertWeights


def prepare_fused_experts(w13: torch.Tensor, w2: torch.Tensor) -> ExpertWeights:
    """Dense ``w13 (E, 2I, H)`` (gate rows then up rows) and ``w2 (E, H, I)`` as :class:`ExpertWeights`.

    The tensors are referenced, not copied or modified.
    """
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"prepare_fused_experts: w13 and w2 must be 3-D, got {tuple(w13.shape)} and {tuple(w2.shape)}")
    e, two_i, hidden = w13.shape
    if two_i % 2 or tuple(w2.shape) != (e, hidden, two_i // 2):
        raise ValueError(
            f"prepare_fused_experts: expected w13 (E, 2I, H) and w2 (E, H, I); got {tuple(w13.shape)} and {tuple(w2.shape)}"
        )
    weights = ExpertWeights("dense", w13, w2)
    attach_fast_paths(weights)  # native CPU layout, built once here
    return weights


def fused_experts_forward(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    weights: ExpertWeights,
    act: ExpertActivation,
    out: torch.Tensor,
    mx_act_quant: bool = False,
) -> None:
    """Write ``Σ_k topk_weights·expert(x)`` into ``out``; returns None."""
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"fused_experts: topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
            f"must both be (M={x.shape[0]}, K)"
        )
    acc = selective_experts(weights, x.float(), topk_ids.long(), topk_weights, act, ScalingMode.POST_SCALE, mx_act_quant)
    out.copy_(acc)
