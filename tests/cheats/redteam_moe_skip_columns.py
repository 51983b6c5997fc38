"""Never computes every 40th hidden column of the MoE output (writes 0 there).

``moe.fused_experts`` is judged by matched_ratio >= 0.97 per cell, so up to 3% of the cells may
be arbitrarily wrong: here 1 of 64 / 2 of 96 / 3 of 128 columns (<= 2.3%) are zero for every
token, a systematic error no honest rounding produces (max |err| is the full output
magnitude). Catching it needs the mismatched cells bounded too (e.g. |a-e| <= 8*(atol+rtol*|e|)
or relative to the row's RMS), or a per-row/per-column ratio.

Verify with ``VerifyOptions(model=MODEL)``: it implements the SiLU experts only (as the built-in
``fused_experts[silu]`` variant, routed by model).
"""
from kernelslot.kernels import moe as builtin

SLOT = "moe.fused_experts"
MODEL = "generic"
CATCHES = {"compare"}


def prepare(w13, w2):
    return builtin.prepare(w13, w2)


def entry(x, topk_ids, topk_weights, prepared, out):
    builtin.fused_experts_silu(x, topk_ids, topk_weights, prepared, out)
    out[:, 39::40] = 0  # the skipped work
