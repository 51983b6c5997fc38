"""The MoE decode block (seed 003): norm → router → masking → expert leaves → scaling (+ shared).

Seed 003 is the MoE decode megakernel source document the project was created from
(``../shared/seeds/003_fbad06efb3d9daf3.txt``, a walkthrough of nkilib's ``moe_block_tkg``);
this package is its device-neutral rewrite: one module per stage, each with a plain-torch twin
(``*_reference``) beside it, fast paths chosen only by :mod:`experts_dispatch`; see
``docs/moe_block.md``. The data contract (:class:`ExpertWeights`, :class:`ExpertActivation`,
:class:`ScalingMode`) lives in :mod:`kernelslot.kernels.experts_spec`.

Dimensions (every stage): ``T`` tokens of the decode step, ``H`` hidden, ``E`` global experts,
``E_L`` local experts on this rank (global ``e`` is local ``e - rank_id·E_L``), ``K`` top-k,
``I`` intermediate size per expert. Tensors are row-major, one token per row.

Stages, in call order::

    orchestrator.py      moe_block_tkg: one pass over the stages below; config.py holds its flags
    rmsnorm.py           h = rmsnorm(x [+ residual])       x (T, H) -> h (T, H) fp32, once
    router.py            logits (T, E), expert_index (T, K), affinities (T, E) fp32
    masking.py           rank slice + keystone index mask   (T, E) -> (T, E_L)
    leaves.py            selective | all-expert            -> (T, H) fp32 Σ_routed coef·expert(h)
    projections.py       one expert: gate/up -> act -> [MXFP8] -> down, fp32
    expert_weights.py    per-expert dequantisation to fp32 (dense, FP8-row, MXFP4/8, NVFP4)
    shared_expert.py     the shared expert on the same h
    fused_experts.py     ``moe.fused_experts`` on the selective leaf

The keystone is the seed's name for the one condition ``router_pre_norm ∧ ¬norm_topk_prob``
under which the router leaves dense affinities, so the all-expert path must re-apply the top-K
index mask itself (:attr:`MoeBlockConfig.needs_index_mask`).

Pseudocode of the whole block::

    h   = rmsnorm(x [+ residual]) · gamma                   # fp32, reused by router and experts
    ids, aff = router_topk(h)                               # global ids, fp32 affinities
    acc = Σ_routed coef · expert(h)                         # coef = aff (POST_SCALE) | 1 (NO_SCALE)
    out = routed_scaling_factor · acc + shared(h)           # the factor applied once

Public entry points: :func:`moe_block_tkg` (the fused block), :func:`prepare_moe_block`,
:func:`choose_strategy`, the leaves :func:`selective_experts` / :func:`all_expert_experts` and
their twin :func:`experts_reference`, and :func:`fused_experts_forward` /
:func:`prepare_fused_experts` for ``moe.fused_experts``.
"""
from kernelslot.kernels.experts_spec import ScalingMode
from kernelslot.kernels.moe_block.config import MoeBlockConfig, SharedExpert
from kernelslot.kernels.moe_block.fused_experts import fused_experts_forward, prepare_fused_experts
from kernelslot.kernels.moe_block.leaves import all_expert_experts, experts_reference, selective_experts
from kernelslot.kernels.moe_block.orchestrator import MoeBlockParams, choose_strategy, moe_block_tkg, prepare_moe_block
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights

__all__ = [
    "MoeBlockConfig", "ScalingMode", "SharedExpert", "ExpertActivation", "ExpertWeights", "MoeBlockParams",
    "moe_block_tkg", "prepare_moe_block", "choose_strategy", "selective_experts", "all_expert_experts",
    "experts_reference", "fused_experts_forward", "prepare_fused_experts",
]
