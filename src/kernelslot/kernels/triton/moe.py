"""Triton ``moe.fused_experts``: ``out[m] = Σ_k w[m,k]·W2[e]·act(W13[e]·x[m])``, ``e = topk_ids[m,k]``.

``prepare`` takes the slot's two forms and returns an :class:`ExpertWeights` that references the
weights (nothing is copied, repacked or cached by id): dense ``prepare(w13 (E, 2I, H), w2 (E, H, I))``
in fp32/bf16/fp16, and ``prepare("nvfp4_layer", Nvfp4MoeLayer)``, whose E4M3 block scales are
unswizzled once (:func:`kernelslot.kernels.moe.nvfp4_expert_weights`) while the E2M1 bytes are
used as stored. The entries run :func:`.experts.expert_mlp` with the raw ``topk_weights`` as
coefficients (no renormalisation; ids of -1 contribute nothing): one entry per activation family,
routed by the call's ``model`` like the torch entries. Graph-safe (no host synchronisation).
"""
from __future__ import annotations

import torch

from kernelslot.formats import Nvfp4MoeLayer
from kernelslot.kernels.moe import NVFP4_TAG, SILU, SWIGLUOAI, nvfp4_expert_weights
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.kernels.triton.experts import expert_mlp

__all__ = ["prepare", "fused_experts_silu", "fused_experts_swigluoai"]


def prepare(w13_or_tag, w2_or_view) -> ExpertWeights:
    """Dense ``(w13, w2)`` or ``("nvfp4_layer", view)`` as :class:`ExpertWeights` (references, never mutates)."""
    if isinstance(w13_or_tag, str):
        if w13_or_tag != NVFP4_TAG or not isinstance(w2_or_view, Nvfp4MoeLayer):
            raise ValueError(f"prepare: tagged form must be prepare({NVFP4_TAG!r}, Nvfp4MoeLayer), got {w13_or_tag!r}")
        return nvfp4_expert_weights(w2_or_view)
    w13, w2 = w13_or_tag, w2_or_view
    if w13.dim() != 3 or w13.shape[1] % 2 or tuple(w2.shape) != (w13.shape[0], w13.shape[2], w13.shape[1] // 2):
        raise ValueError(f"prepare: expected w13 (E, 2I, H) and w2 (E, H, I); got {tuple(w13.shape)} and "
                         f"{tuple(w2.shape)}")
    return ExpertWeights("dense", w13, w2)


def _forward(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, prepared: ExpertWeights,
             act: ExpertActivation, out: torch.Tensor) -> None:
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"fused_experts: topk_ids {tuple(topk_ids.shape)} and topk_weights "
                         f"{tuple(topk_weights.shape)} must both be (M={x.shape[0]}, K)")
    expert_mlp(prepared, x, topk_ids, topk_weights.float(), act, out)


def fused_experts_silu(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, prepared: ExpertWeights,
                       out: torch.Tensor) -> None:
    """``out[m] = Σ_k w[m,k]·W2[e]·(silu(g)·u)``; ids of -1 contribute nothing; returns None."""
    _forward(x, topk_ids, topk_weights, prepared, SILU, out)


def fused_experts_swigluoai(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                            prepared: ExpertWeights, out: torch.Tensor) -> None:
    """As :func:`fused_experts_silu` with swigluoai(α=1.702, limit=7) (GPT-OSS, MiniMax-M3)."""
    _forward(x, topk_ids, topk_weights, prepared, SWIGLUOAI, out)
