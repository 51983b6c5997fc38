"""Triton ``moe.block_tkg``: the block's torch orchestration with Triton expert leaves.

Norm, router, masking, strategy and the shared-expert gate are the torch stages of
:mod:`kernelslot.kernels.moe_block` (:func:`~kernelslot.kernels.moe_block.orchestrator.block_forward`),
unchanged; the expert computation of both leaves and of the shared expert is
:func:`.experts.expert_mlp` (every format of :class:`ExpertWeights`, biases, every activation and
clamp, the MXFP8 activation rounding of the MX path), on the leaves' boundary (``leaves.py``):
``(weights, h fp32 (T, H), local_index (T, K) or -1, affinities, act, scaling, mx_act_quant) ->
fp32 (T, H)``.

- selective: the routed ``(T, K)`` ids with the top-K affinities as coefficients (POST_SCALE) or
  none (NO_SCALE: each routed expert counts once);
- all-expert: every (token, local expert) whose coefficient is non-zero, the coefficient being the
  masked affinity sheet (POST_SCALE) or the routed indicator (NO_SCALE), so both leaves sum the
  same routed set.

``prepare("moe_block", layer)`` builds the block's :class:`MoeBlockParams` (references to the
layer's tensors; no native layout attached, nothing cached). Not graph-safe: the torch router
stages are not verified under capture.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights, ScalingMode
from kernelslot.kernels.moe_block.masking import routed_indicator
from kernelslot.kernels.moe_block.orchestrator import MoeBlockParams, block_forward, check_hidden
from kernelslot.kernels.triton.experts import expert_mlp

__all__ = ["prepare", "moe_block_tkg", "selective_leaf", "all_expert_leaf"]


def prepare(kind: str, layer: Any) -> MoeBlockParams:
    """``prepare("moe_block", layer)``: :class:`MoeBlockParams` from the layer view's fields (never mutated)."""
    if kind != "moe_block":
        raise ValueError(f"prepare: unknown layer kind {kind!r}; expected 'moe_block'")
    names = [f.name for f in dataclasses.fields(MoeBlockParams)]
    missing = [n for n in names if not hasattr(layer, n)]
    if missing:
        raise TypeError(f"prepare: layer view lacks {missing}; expected fields {names}")
    return MoeBlockParams(**{n: getattr(layer, n) for n in names})


def selective_leaf(weights: ExpertWeights, h: torch.Tensor, local_index: torch.Tensor, topk_affinities: torch.Tensor,
                   act: ExpertActivation, scaling: ScalingMode, mx_act_quant: bool = False) -> torch.Tensor:
    """Each token's routed experts (``local_index (T, K)``, -1 = another rank's); fp32 ``(T, H)``."""
    acc = torch.empty(h.shape, dtype=torch.float32, device=h.device)
    coef = topk_affinities.float() if scaling is ScalingMode.POST_SCALE else None
    expert_mlp(weights, h, local_index, coef, act, acc, mx_act_quant)
    return acc


def all_expert_leaf(weights: ExpertWeights, h: torch.Tensor, local_index: torch.Tensor, masked_affinities: torch.Tensor,
                    act: ExpertActivation, scaling: ScalingMode, mx_act_quant: bool = False) -> torch.Tensor:
    """Every (token, local expert) with a non-zero coefficient (``masked_affinities (T, E_L)``); fp32 ``(T, H)``."""
    if scaling is ScalingMode.POST_SCALE:
        coef = masked_affinities.float()
    else:
        coef = routed_indicator(local_index, weights.num_experts)
    experts = torch.arange(weights.num_experts, device=h.device).expand_as(coef)
    ids = torch.where(coef != 0, experts, torch.full_like(experts, -1))
    acc = torch.empty(h.shape, dtype=torch.float32, device=h.device)
    expert_mlp(weights, h, ids, coef, act, acc, mx_act_quant)
    return acc


def moe_block_tkg(x: torch.Tensor, residual: Optional[torch.Tensor], prepared: MoeBlockParams, eps: float,
                  out: torch.Tensor, out_residual: Optional[torch.Tensor] = None,
                  router_logits: Optional[torch.Tensor] = None) -> None:
    """The fused decode block with Triton experts; writes ``out`` (and the optional outputs) in place."""
    check_hidden(x, prepared)
    out.copy_(block_forward(x, residual, prepared, eps, out_residual, router_logits, selective_leaf, all_expert_leaf))
