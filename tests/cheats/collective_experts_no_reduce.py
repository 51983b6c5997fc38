"""moe.fused_experts_reduce without the reduce: each rank writes only its own experts' (or I-slice's) share."""
from kernelslot.kernels.collective import GENERIC_ACTIVATION
from kernelslot.kernels.moe_block import fused_experts_forward, prepare_fused_experts

SLOT = "moe.fused_experts_reduce"
CATCHES = {"compare"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def prepare(w13, w2):
    return prepare_fused_experts(w13, w2)


def entry(x, topk_ids, topk_weights, prepared, out, group):
    fused_experts_forward(x, topk_ids, topk_weights, prepared, GENERIC_ACTIVATION, out)
