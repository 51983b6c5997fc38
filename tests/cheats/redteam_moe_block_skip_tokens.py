"""Skips the experts of every 40th token in large decode batches (T >= 64) of the MoE block.

``moe.block_tkg`` is judged by matched_ratio >= 0.97 per cell. With T=64 or T=128 one token in
40 is 1.6-2.3% of the rows, so leaving those rows without their routed experts (here: zero)
passes although each such row is wholly wrong. Small-T profiles never hit the condition.
Catching it needs a bound on the error of the mismatched cells (or a per-row ratio, e.g. every
row >= 0.9 matched).
"""
from kernelslot.kernels.moe_block import moe_block_tkg, prepare_moe_block

SLOT = "moe.block_tkg"
CATCHES = {"compare", "replay"}


def prepare(kind, layer):
    return prepare_moe_block(kind, layer)


def entry(x, residual, prepared, eps, out, out_residual, router_logits):
    moe_block_tkg(x, residual, prepared, eps, out, out_residual, router_logits)
    if x.shape[0] >= 64:
        out[39::40] = 0  # the skipped tokens
