"""The NVFP4 path's output written through a 2-significant-bit format (E2M1's precision).

An FP4 epilogue: exact on the dense profiles, and on MiniMax-M3's NVFP4 profile every output cell
rounded to 2 significant bits, an error (relative up to 20%, cosine about 0.995) the low-bit
cosine comparator's path allowance must not cover. moe.fused_experts' low-bit comparator
(cosine >= 0.999 and matched_ratio >= 0.90) rejects it; the oracle battery holds the same answer
("rounded to 2 significant bits", verify/oracle.py) so its margin prints.
"""
import torch

from kernelslot.kernels import moe as builtin

SLOT = "moe.fused_experts"
CATCHES = {"compare"}
MODEL = "MiniMax-M3"
DOMAIN = {"model": {"exact": "MiniMax-M3"}}


def prepare(a, b):
    return builtin.prepare(a, b)


def entry(x, topk_ids, topk_weights, prepared, out):
    if prepared.format != "nvfp4":
        builtin.fused_experts_swigluoai(x, topk_ids, topk_weights, prepared, out)
        return
    full = torch.empty(out.shape, dtype=torch.float32)
    builtin.fused_experts_swigluoai(x, topk_ids, topk_weights, prepared, full)
    m, e = torch.frexp(full)
    out.copy_(torch.ldexp(torch.round(m * 4) / 4, e))
