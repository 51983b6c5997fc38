"""kernelslot's built-in fused experts (native layout) behind the slot ABI."""
from kernelslot.kernels.moe_block import ExpertActivation, ExpertWeights, fused_experts_forward
from kernelslot.kernels.moe_block.experts_dispatch import attach_fast_paths

SILU = ExpertActivation("silu")
SWIGLUOAI = ExpertActivation.swigluoai(1.702, 7.0)


def prepare(w13, w2):
    w = ExpertWeights("dense", w13, w2)
    attach_fast_paths(w)
    return w


def silu_experts(x, topk_ids, topk_weights, prepared, out):
    fused_experts_forward(x, topk_ids, topk_weights, prepared, SILU, out)


def swigluoai_experts(x, topk_ids, topk_weights, prepared, out):
    fused_experts_forward(x, topk_ids, topk_weights, prepared, SWIGLUOAI, out)
