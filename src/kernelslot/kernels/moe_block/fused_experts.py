"""The built-in ``moe.fused_experts`` computation, on the block's selective leaf.

The slot ``moe.fused_experts`` is the experts half of an MoE layer alone: the engine has
already routed, so the ids and weights arrive as given. This module runs them on the decode
block's selective leaf (:mod:`leaves`), so both slots share one expert path and its native
fast path (attached here at prepare time).

Dimensions:
    M tokens, H hidden, E experts, K top-k, I intermediate.

Arguments:
    :func:`prepare_fused_experts`: dense ``w13 (E, 2I, H)`` (gate rows then up rows) and
    ``w2 (E, H, I)``; referenced, not copied or modified.
    :func:`fused_experts_forward`: ``x (M, H)``; ``topk_ids (M, K)`` expert ids in ``[0, E)`` or
    ``-1`` (contributes nothing); ``topk_weights (M, K)`` fp32 raw multipliers applied as given
    (POST_SCALE, no renormalisation); ``weights`` (:class:`ExpertWeights`, any format); ``act``;
    ``out (M, H)``; ``mx_act_quant`` (MXFP8 activations, as on the block's MX path).

Returns / Writes:
    :func:`prepare_fused_experts` returns ``ExpertWeights("dense", w13, w2)``;
    :func:`fused_experts_forward` writes ``out`` honouring its strides and dtype, returns None.

Pseudocode::

    acc[m] = Σ_k topk_weights[m, k] · expert_{topk_ids[m, k]}(x[m].float())    # fp32
    expert_e(x) = (act(clamp(g)) · (clamp(u) + β))·W2[e]ᵀ + b2,  g | u = x·W13[e]ᵀ + b13
    out.copy_(acc)
"""
from __future__ import annotations

import torch

from kernelslot.kernels.experts_spec import ScalingMode
from kernelslot.kernels.moe_block.experts_dispatch import attach_fast_paths
from kernelslot.kernels.moe_block.leaves import selective_experts
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights


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
