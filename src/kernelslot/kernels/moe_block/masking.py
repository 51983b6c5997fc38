"""Affinity masking: the rank slice and the top-K index mask (seed 003 ``mask_expert_affinities``).

Seed 003 is the MoE decode megakernel source document the project was created from
(``../shared/seeds/003_fbad06efb3d9daf3.txt``, a walkthrough of nkilib's ``moe_block_tkg``).
This stage sits between the router and the leaves: it turns the router's global ``(T, E)``
affinities into this rank's ``(T, E_L)`` coefficient sheet for the all-expert leaf, and maps
global ids to local ids for both leaves. This rank owns global experts
``[rank_id·E_L, rank_id·E_L + E_L)``.

Dimensions:
    T tokens, E global experts, E_L local experts on this rank, K top-k.

Arguments:
    affinities         (T, E) fp32 from the router.
    expert_index       (T, K) global ids (int; ``-1`` allowed in :func:`local_expert_index`).
    rank_id            this rank; its first local expert is global ``rank_id·E_L``.
    num_local_experts  E_L.
    apply_index_mask   the keystone ``router_pre_norm ∧ ¬norm_topk_prob``, decided by the
                       orchestrator (which also requires POST_SCALE). The keystone is the
                       seed's name for the one condition under which the router leaves dense
                       affinities, so the top-K mask must be re-applied here.

Returns:
    :func:`mask_affinities`: fp32 (T, E_L), a fresh tensor (ValueError if the slice passes E).
    :func:`local_expert_index`: int64 (T, K) local ids, ``-1`` for experts of other ranks
    (``-1`` inputs stay ``-1``). :func:`routed_indicator`: fp32 (T, E_L), 1 where routed.

Pseudocode::

    local = affinities[:, rank_id·E_L : rank_id·E_L + E_L].float()
    if apply_index_mask:
        for e in range(E_L):  local[:, e] *= any(expert_index == rank_id·E_L + e, over K)
    local_index = expert_index - rank_id·E_L   where in [0, E_L), else -1
"""
from __future__ import annotations

import torch


def local_expert_index(expert_index: torch.Tensor, rank_id: int, num_local_experts: int) -> torch.Tensor:
    """Global ids ``(T, K)`` -> local ids ``(T, K)`` int64, ``-1`` where not on this rank."""
    local = expert_index.long() - rank_id * num_local_experts
    on_rank = (expert_index >= 0) & (local >= 0) & (local < num_local_experts)
    return torch.where(on_rank, local, torch.full_like(local, -1))


def routed_indicator(local_index: torch.Tensor, num_local_experts: int) -> torch.Tensor:
    """``(T, K)`` local ids (``-1`` = none) -> fp32 ``(T, E_L)``: 1 where the token routed to the expert."""
    hits = torch.zeros(local_index.shape[0], num_local_experts + 1, dtype=torch.float32, device=local_index.device)
    slot = torch.where(local_index >= 0, local_index, torch.full_like(local_index, num_local_experts))
    hits.scatter_(1, slot, 1.0)
    return hits[:, :num_local_experts]


def mask_affinities(
    affinities: torch.Tensor,
    expert_index: torch.Tensor,
    rank_id: int,
    num_local_experts: int,
    apply_index_mask: bool,
) -> torch.Tensor:
    """Rank slice, then (only if ``apply_index_mask``) the top-K index mask. Returns fp32 ``(T, E_L)``."""
    offset = rank_id * num_local_experts
    if offset + num_local_experts > affinities.shape[1]:
        raise ValueError(
            f"mask_affinities: rank {rank_id} × E_L {num_local_experts} exceeds E={affinities.shape[1]}"
        )
    local = affinities[:, offset : offset + num_local_experts].float()
    if not apply_index_mask:
        return local.clone()
    return local * routed_indicator(local_expert_index(expert_index, rank_id, num_local_experts), num_local_experts)


def mask_affinities_reference(
    affinities: torch.Tensor,
    expert_index: torch.Tensor,
    rank_id: int,
    num_local_experts: int,
    apply_index_mask: bool,
) -> torch.Tensor:
    """Torch twin, following the seed's loop: for each local expert, keep the column iff the
    expert's global id appears among the token's K ids."""
    offset = rank_id * num_local_experts
    masked = affinities[:, offset : offset + num_local_experts].float().clone()
    if apply_index_mask:
        for e in range(num_local_experts):
            keep = (expert_index == offset + e).any(dim=1)
            masked[:, e] *= keep.float()
    return masked
