"""The seed-003 MoE decode block: norm → router → masking → expert leaves → scaling (+ shared).

One module per stage, each with a plain-torch twin (``*_reference``) beside it; see
``docs/moe_block.md``. Public entry points: :func:`moe_block_tkg` (the fused block),
:func:`prepare_moe_block`, the leaves :func:`selective_experts` / :func:`all_expert_experts`,
and :func:`fused_experts_forward` / :func:`prepare_fused_experts` for ``moe.fused_experts``.
"""
from kernelslot.kernels.moe_block.config import MoeBlockConfig, ScalingMode, SharedExpert
from kernelslot.kernels.moe_block.fused_experts import fused_experts_forward, prepare_fused_experts
from kernelslot.kernels.moe_block.leaves import all_expert_experts, experts_reference, selective_experts
from kernelslot.kernels.moe_block.orchestrator import MoeBlockParams, choose_strategy, moe_block_tkg, prepare_moe_block
from kernelslot.kernels.moe_block.spec import ExpertActivation, ExpertWeights

__all__ = [
    "MoeBlockConfig", "ScalingMode", "SharedExpert", "ExpertActivation", "ExpertWeights", "MoeBlockParams",
    "moe_block_tkg", "prepare_moe_block", "choose_strategy", "selective_experts", "all_expert_experts",
    "experts_reference", "fused_experts_forward", "prepare_fused_experts",
]
