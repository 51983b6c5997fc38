"""Block-level configuration of the MoE decode block (seed 003 ``moe_block_tkg``).

Seed 003 is the MoE decode megakernel source document the project was created from
(``../shared/seeds/003_fbad06efb3d9daf3.txt``, a walkthrough of nkilib's ``moe_block_tkg``).
Everything here is data: the router and scaling modes, the strategy hint, the optional shared
expert, and :class:`MoeBlockConfig`, which validates the combination once, at construction, so
that no stage has to re-check it. The orchestrator reads it; every stage receives its fields.

Dimensions:
    ``E`` global experts, ``E_L`` local experts on this rank, ``K`` top-k, ``H`` hidden.
    Global expert ``e`` is local ``e - rank_id·E_L``; affinities and every accumulator are fp32.

Arguments (:class:`MoeBlockConfig` fields):
    top_k (K, in [1, E]); num_experts (E); num_local_experts (E_L, divides E);
    rank_id (in [0, E/E_L)); router_activation ``sigmoid`` | ``softmax``; router_pre_norm,
    norm_topk_prob (see the class); scaling ``POST_SCALE`` | ``NO_SCALE`` (a name is parsed;
    PRE_SCALE and PRE_SCALE_DELAYED raise); activation (:class:`ExpertActivation`);
    routed_scaling_factor (float, applied once by the orchestrator); strategy ``all_expert`` |
    ``selective`` | ``auto``.
    :class:`SharedExpert`: ``weights`` (one expert), ``activation``, optional ``gate`` (H,).

Returns:
    Frozen dataclasses; an invalid combination raises ValueError when built. Properties:
    ``expert_offset`` and ``needs_index_mask`` (below).

Pseudocode::

    scaling = ScalingMode.parse(scaling); reject PRE_SCALE, PRE_SCALE_DELAYED
    require 1 <= K <= E,  E % E_L == 0,  0 <= rank_id < E / E_L
    expert_offset    = rank_id · E_L
    needs_index_mask = router_pre_norm and not norm_topk_prob      # the keystone

The keystone is the seed's name for that one boolean (``moe_block_tkg.py:331``): the single
condition under which the router leaves dense affinities, so the all-expert path must re-apply
the top-K index mask itself (docs/moe_block.md, "The keystone").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights, ScalingMode

ROUTER_ACTIVATIONS = ("sigmoid", "softmax")
STRATEGIES = ("all_expert", "selective", "auto")


def check_decode_scaling(mode: ScalingMode) -> None:
    """Reject the scaling modes the decode block does not implement (seed moe_tkg.py:382-387)."""
    if mode is ScalingMode.PRE_SCALE:
        raise ValueError("scaling mode PRE_SCALE is not supported by the MoE decode block; use POST_SCALE or NO_SCALE")
    if mode is ScalingMode.PRE_SCALE_DELAYED:
        raise ValueError(
            "scaling mode PRE_SCALE_DELAYED applies to prefill (CTE) kernels only; use POST_SCALE or NO_SCALE for decode"
        )


@dataclass(frozen=True)
class SharedExpert:
    """A dense expert applied to every token on the same normed hidden.

    ``weights`` is an :class:`ExpertWeights` with exactly one expert. With ``gate`` (shape
    ``(H,)``) the output is multiplied by ``σ(h·gate)`` per token (Qwen2-MoE style); without it
    the shared output is added as is (MiniMax-M3).
    """

    weights: ExpertWeights
    activation: ExpertActivation
    gate: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        if self.weights.num_experts != 1:
            raise ValueError(f"SharedExpert.weights must hold one expert, got {self.weights.num_experts}")
        if self.gate is not None and tuple(self.gate.shape) != (self.weights.hidden_size,):
            raise ValueError(
                f"SharedExpert.gate must have shape ({self.weights.hidden_size},), got {tuple(self.gate.shape)}"
            )


@dataclass(frozen=True)
class MoeBlockConfig:
    """The block's mode flags (seed ``moe_block_tkg`` signature), validated once.

    ``router_pre_norm``: activation over all ``E`` logits before top-K (dense affinities) when
    True; top-K on raw logits and activation over the ``K`` chosen only when False.
    ``norm_topk_prob``: the ``K`` chosen affinities are divided by their sum.
    ``routed_scaling_factor`` multiplies the routed sum once, after the experts, before the
    shared expert is added.
    """

    top_k: int
    num_experts: int  # E, global
    num_local_experts: int  # E_L on this rank
    rank_id: int = 0
    router_activation: str = "softmax"
    router_pre_norm: bool = True
    norm_topk_prob: bool = False
    scaling: ScalingMode = ScalingMode.POST_SCALE
    activation: ExpertActivation = ExpertActivation()
    routed_scaling_factor: float = 1.0
    strategy: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "scaling", ScalingMode.parse(self.scaling))
        check_decode_scaling(self.scaling)
        if self.router_activation not in ROUTER_ACTIVATIONS:
            raise ValueError(f"router_activation={self.router_activation!r}; allowed: {ROUTER_ACTIVATIONS}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r}; allowed: {STRATEGIES}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k={self.top_k} must lie in [1, num_experts={self.num_experts}]")
        if self.num_local_experts < 1 or self.num_experts % self.num_local_experts:
            raise ValueError(
                f"num_local_experts={self.num_local_experts} must divide num_experts={self.num_experts}"
            )
        ranks = self.num_experts // self.num_local_experts
        if not 0 <= self.rank_id < ranks:
            raise ValueError(
                f"rank_id={self.rank_id} outside [0, {ranks}) for E={self.num_experts}, E_L={self.num_local_experts}"
            )

    @property
    def expert_offset(self) -> int:
        """Global id of this rank's first local expert: ``rank_id·E_L``."""
        return self.rank_id * self.num_local_experts

    @property
    def needs_index_mask(self) -> bool:
        """THE KEYSTONE (seed moe_block_tkg.py:331): only pre-norm routing without
        renormalisation leaves dense affinities, so only then must the all-expert leaf
        re-apply the top-K mask. Every other combination is masked by the router's scatter."""
        return self.router_pre_norm and not self.norm_topk_prob
