"""Cheat for ``moe.block_tkg``: the all-expert leaf without the keystone index mask.

It always runs all-expert and never zeroes the experts a token did not route to, so under
``router_pre_norm ∧ ¬norm_topk_prob`` every local expert contributes with its dense softmax
affinity. Must fail the referee's compare.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from kernelslot.kernels.moe_block.leaves import all_expert_experts
from kernelslot.kernels.moe_block.masking import local_expert_index, mask_affinities
from kernelslot.kernels.moe_block.orchestrator import MoeBlockParams, prepare_moe_block
from kernelslot.kernels.moe_block.rmsnorm import residual_rmsnorm
from kernelslot.kernels.moe_block.router import route
from kernelslot.kernels.moe_block.shared_expert import MX_FORMATS, shared_expert_forward


def prepare(kind: str, layer: Any) -> MoeBlockParams:
    return prepare_moe_block(kind, layer)


def entry(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    prepared: MoeBlockParams,
    eps: float,
    out: torch.Tensor,
    out_residual: Optional[torch.Tensor],
    router_logits: Optional[torch.Tensor],
) -> None:
    cfg = prepared.config
    h = residual_rmsnorm(x, residual, prepared.gamma, eps, out_residual)
    r = route(h, prepared.router_weight, cfg.top_k, cfg.router_activation, cfg.router_pre_norm, cfg.norm_topk_prob,
              prepared.router_bias, prepared.correction_bias)
    if router_logits is not None:
        router_logits.copy_(r.logits)
    masked = mask_affinities(r.affinities, r.expert_index, cfg.rank_id, cfg.num_local_experts, apply_index_mask=False)
    local = local_expert_index(r.expert_index, cfg.rank_id, cfg.num_local_experts)
    acc = all_expert_experts(prepared.experts, h, local, masked, cfg.activation, cfg.scaling,
                             prepared.experts.format in MX_FORMATS)
    acc = acc * cfg.routed_scaling_factor
    if prepared.shared is not None:
        acc = acc + shared_expert_forward(prepared.shared, h)
    out.copy_(acc)
