"""The expert-MLP leaves of the 2×2 matrix (seed 003 ``moe_tkg``), with their torch twin.

Seed 003 is the MoE decode megakernel source document the project was created from
(``../shared/seeds/003_fbad06efb3d9daf3.txt``, a walkthrough of nkilib's ``moe_block_tkg``).
Its 2×2 matrix is strategy (all-expert | selective) × weight format (MX | bf16/fp8); here the
strategy is two functions and the format axis is the per-expert dequantisation
(:mod:`expert_weights`) plus ``mx_act_quant``. The leaves run after the router / masking and
before the orchestrator's routed scaling and shared expert; both share one boundary, so
:mod:`experts_dispatch` can serve either natively (tried first) behind it::

    leaf(weights: ExpertWeights, h: fp32 (T, H), local_index: (T, K) local ids or -1,
         affinities, act: ExpertActivation, scaling: ScalingMode, mx_act_quant: bool)
        -> fp32 (T, H) accumulator  Σ_routed coef · expert(h)

Dimensions:
    T tokens, H hidden, E_L local experts, K top-k, I intermediate.

Arguments:
    weights       :class:`ExpertWeights` of the E_L local experts, any format.
    h             (T, H) fp32, the normed hidden.   local_index: ids in [0, E_L), or -1
                  (not on this rank: contributes nothing).
    affinities    selective: ``topk_affinities`` (T, K) aligned with ``local_index``;
                  all-expert: ``masked_affinities`` (T, E_L) from :mod:`masking`.
    act           the gated activation (:mod:`projections`).
    scaling       POST_SCALE (coef = affinity) | NO_SCALE (coef = 1 over each token's routed set).
    mx_act_quant  MXFP8-quantise the expert input and the intermediate (MX weights).

Returns:
    fp32 (T, H), without ``routed_scaling_factor`` and without the shared expert.

Pseudocode::

    x = mxfp8_roundtrip(h) if mx_act_quant else h                     # once per call
    selective:  for e in routed local ids: for (t, k) with local_index[t, k] == e:
                    acc[t] += coef[t, k] · expert_e(x[t])              # coef = topk_affinities | 1
    all-expert: coef = masked_affinities (POST_SCALE) | routed_indicator(local_index) (NO_SCALE)
                for e with any(coef[:, e] != 0):  acc += expert_e(x) · coef[:, e]
    expert_e(x) = projections.expert_mlp(x) = (act(clamp(g))·(clamp(u) + β) [→ MXFP8])·W2ᵀ + b2

All-expert is dense compute, sparse result: every token runs through every local expert whose
coefficient column is not all zero, and the coefficient collapses the sum to the routed set.
The twin gathers every (token, k) pair at once on fully dequantised weights.
"""
from __future__ import annotations

import torch

from kernelslot.kernels.experts_spec import ScalingMode
from kernelslot.kernels.moe_block.config import check_decode_scaling
from kernelslot.kernels.moe_block.expert_weights import dequantize_experts, expert_projection
from kernelslot.kernels.moe_block.experts_dispatch import native_all_expert, native_selective
from kernelslot.kernels.moe_block.masking import routed_indicator
from kernelslot.kernels.moe_block.projections import expert_input, expert_mlp, gated_activation_reference, mxfp8_roundtrip
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights


def _check(weights: ExpertWeights, h: torch.Tensor, local_index: torch.Tensor, scaling: ScalingMode) -> None:
    check_decode_scaling(scaling)
    if h.dim() != 2 or h.shape[1] != weights.hidden_size:
        raise ValueError(f"expert leaf: hidden must be (T, H={weights.hidden_size}), got {tuple(h.shape)}")
    if local_index.dim() != 2 or local_index.shape[0] != h.shape[0]:
        raise ValueError(f"expert leaf: local_index must be (T={h.shape[0]}, K), got {tuple(local_index.shape)}")
    if bool((local_index >= weights.num_experts).any()) or bool((local_index < -1).any()):
        raise ValueError(f"expert leaf: local ids must lie in [-1, {weights.num_experts})")


def _run_expert(weights: ExpertWeights, e: int, x: torch.Tensor, act: ExpertActivation, mx_act_quant: bool) -> torch.Tensor:
    """Expert ``e`` on the prepared expert input ``x`` (see :func:`expert_input`)."""
    return expert_mlp(x, expert_projection(weights, e, "gate_up"), expert_projection(weights, e, "down"), act, mx_act_quant)


def selective_experts(
    weights: ExpertWeights,
    h: torch.Tensor,
    local_index: torch.Tensor,
    topk_affinities: torch.Tensor,
    act: ExpertActivation,
    scaling: ScalingMode,
    mx_act_quant: bool = False,
) -> torch.Tensor:
    """Selective leaf: gather each token's routed experts. Returns fp32 ``(T, H)``."""
    _check(weights, h, local_index, scaling)
    fast = native_selective(weights, h, local_index, topk_affinities, act, scaling, mx_act_quant)
    if fast is not None:
        return fast
    x = expert_input(h.float(), mx_act_quant)
    acc = torch.zeros_like(x)
    for e in torch.unique(local_index[local_index >= 0]).tolist():
        tokens, slots = torch.nonzero(local_index == e, as_tuple=True)
        y = _run_expert(weights, e, x[tokens], act, mx_act_quant)
        if scaling is ScalingMode.POST_SCALE:
            y = y * topk_affinities[tokens, slots].float().unsqueeze(1)
        acc.index_add_(0, tokens, y)
    return acc


def all_expert_experts(
    weights: ExpertWeights,
    h: torch.Tensor,
    local_index: torch.Tensor,
    masked_affinities: torch.Tensor,
    act: ExpertActivation,
    scaling: ScalingMode,
    mx_act_quant: bool = False,
) -> torch.Tensor:
    """All-expert leaf: every token through every local expert with a non-zero coefficient column."""
    _check(weights, h, local_index, scaling)
    if masked_affinities.shape != (h.shape[0], weights.num_experts):
        raise ValueError(
            f"all-expert leaf: affinities must be (T, E_L)={(h.shape[0], weights.num_experts)}, "
            f"got {tuple(masked_affinities.shape)}"
        )
    if scaling is ScalingMode.POST_SCALE:
        coef = masked_affinities.float()
    else:
        coef = routed_indicator(local_index, weights.num_experts)
    fast = native_all_expert(weights, h, coef, act, mx_act_quant)
    if fast is not None:
        return fast
    x = expert_input(h.float(), mx_act_quant)
    acc = torch.zeros_like(x)
    for e in torch.nonzero(coef.ne(0).any(dim=0)).flatten().tolist():
        acc += _run_expert(weights, e, x, act, mx_act_quant) * coef[:, e : e + 1]
    return acc


def experts_reference(
    weights: ExpertWeights,
    h: torch.Tensor,
    local_index: torch.Tensor,
    topk_affinities: torch.Tensor,
    act: ExpertActivation,
    scaling: ScalingMode,
    mx_act_quant: bool = False,
) -> torch.Tensor:
    """Torch twin of both leaves: every (token, k) pair gathered at once, in fp32."""
    check_decode_scaling(scaling)
    gate_up, down = dequantize_experts(weights)
    valid = local_index >= 0
    ids = torch.where(valid, local_index, torch.zeros_like(local_index)).long()
    x = mxfp8_roundtrip(h.float()) if mx_act_quant else h.float()
    gu = torch.einsum("th,tkoh->tko", x, gate_up[ids])
    if weights.gate_up_bias is not None:
        gu = gu + weights.gate_up_bias.float()[ids]
    inter = gate_up.shape[1] // 2
    a = gated_activation_reference(gu[..., :inter], gu[..., inter:], act)
    if mx_act_quant:
        a = mxfp8_roundtrip(a)
    y = torch.einsum("tki,tkhi->tkh", a, down[ids])
    if weights.down_bias is not None:
        y = y + weights.down_bias.float()[ids]
    coef = topk_affinities.float() if scaling is ScalingMode.POST_SCALE else torch.ones(local_index.shape)
    coef = coef * valid.float()
    return (y * coef.unsqueeze(-1)).sum(dim=1)
