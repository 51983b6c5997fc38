"""Built-in ``moe.fused_experts`` kernels: the MoE block's selective leaf behind the slot ABI.

The slot ``moe.fused_experts`` takes routing as given (the engine's top-K ids and weights) and
computes only the experts; these entries are its built-in kernels, thin wrappers over
:func:`~kernelslot.kernels.moe_block.fused_experts_forward`. ``prepare`` accepts the slot's two
forms, dense ``prepare(w13, w2)`` and the tagged NVFP4 view ``prepare("nvfp4_layer",
Nvfp4MoeLayer)``, and returns :class:`ExpertWeights` (the native layout attached where covered). The
activation is a model fact, so there is one entry per activation family; the slot routes
between them by the ``model`` field of the call descriptor.

Dimensions:
    M tokens, H hidden, E experts, K top-k, I intermediate.

Arguments:
    prepare      dense ``w13 (E, 2I, H)`` (gate rows then up rows), ``w2 (E, H, I)``; or the
                 NVFP4 view: packed E2M1 ``w13_weight (E, 2I, H/2)`` / ``w2_weight (E, H, I/2)``,
                 128×4-swizzled E4M3 block scales (16 along the contraction dim),
                 ``g1/g2_alphas`` and ``a1/a2_inv``.
    entries      ``x (M, H)``; ``topk_ids (M, K)`` in ``[0, E)`` or ``-1`` (contributes
                 nothing); ``topk_weights (M, K)`` applied as given; ``prepared``; ``out (M, H)``.

Writes:
    ``out`` (M, H), in its own dtype and strides; the entries return None.

Pseudocode::

    prepare(nvfp4): scales = unswizzle_128x4(...) once; outer = g_alphas · a_inv per expert
    entry:  out[m] = Σ_k w[m, k] · a·W2[e]ᵀ,  e = topk_ids[m, k],  g | u = x[m]·W13[e]ᵀ   # fp32
            a = silu(g)·u                                      (fused_experts_silu)
            a = swigluoai(α=1.702, limit=7): g'·σ(α·g')·(u'+1)  (fused_experts_swigluoai;
                g' = min(g, 7), u' = clamp(u, -7, 7); GPT-OSS, MiniMax-M3)
"""
from __future__ import annotations

import torch

from kernelslot.formats import Nvfp4MoeLayer, unswizzle_scales_128x4
from kernelslot.kernels.moe_block import ExpertActivation, ExpertWeights, fused_experts_forward, prepare_fused_experts
from kernelslot.kernels.moe_block.experts_dispatch import attach_fast_paths

NVFP4_TAG = "nvfp4_layer"
SILU = ExpertActivation("silu")
SWIGLUOAI = ExpertActivation.swigluoai(1.702, 7.0)


def nvfp4_expert_weights(view: Nvfp4MoeLayer) -> ExpertWeights:
    """The slot's NVFP4 view as ``format="nvfp4"`` weights: scales unswizzled, outer ``g_alpha·a_inv`` per expert."""
    e, two_i, half_h = view.w13_weight.shape
    hidden, inter = half_h * 2, view.intermediate_size
    return ExpertWeights(
        "nvfp4",
        view.w13_weight,
        view.w2_weight,
        gate_up_scale=unswizzle_scales_128x4(view.w13_weight_scale, two_i, hidden // 16),
        down_scale=unswizzle_scales_128x4(view.w2_weight_scale, hidden, inter // 16),
        gate_up_outer=view.g1_alphas * view.a1_inv,
        down_outer=view.g2_alphas * view.a2_inv,
    )


def prepare(w13_or_tag, w2_or_view) -> ExpertWeights:
    if isinstance(w13_or_tag, str):
        if w13_or_tag != NVFP4_TAG or not isinstance(w2_or_view, Nvfp4MoeLayer):
            raise ValueError(f"prepare: tagged form must be prepare({NVFP4_TAG!r}, Nvfp4MoeLayer), got {w13_or_tag!r}")
        weights = nvfp4_expert_weights(w2_or_view)
        attach_fast_paths(weights)  # native CPU layout, built once here
        return weights
    return prepare_fused_experts(w13_or_tag, w2_or_view)


def fused_experts_silu(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, prepared: ExpertWeights,
                       out: torch.Tensor) -> None:
    """``out[m] = Σ_k w[m,k]·W2[e]·(silu(g)·u)``; ids of -1 contribute nothing."""
    fused_experts_forward(x, topk_ids, topk_weights, prepared, SILU, out)


def fused_experts_swigluoai(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                            prepared: ExpertWeights, out: torch.Tensor) -> None:
    """As :func:`fused_experts_silu` with swigluoai(α=1.702, limit=7) (GPT-OSS, MiniMax-M3)."""
    fused_experts_forward(x, topk_ids, topk_weights, prepared, SWIGLUOAI, out)
