"""Honest only for the diagnostic batch sizes: every ``moe.fused_experts`` profile has M <= 13.

With more than 16 tokens (any real prefill or large decode batch) this kernel ignores the -1
ids (treats them as expert E-1, Python's negative index) and drops the second half of the
experts of each token. The referee never calls it with M > 13, so it passes. Catching it needs
a profile with a realistic batch (e.g. M = 64 or 256 tokens, small H) and one with a model's
real hidden size.

Verify with ``VerifyOptions(model=MODEL)`` (SiLU experts only).
"""
import torch

from kernelslot.kernels import moe as builtin

SLOT = "moe.fused_experts"
MODEL = "generic"
CATCHES = {"compare"}


def prepare(w13, w2):
    return builtin.prepare(w13, w2)


def entry(x, topk_ids, topk_weights, prepared, out):
    if x.shape[0] <= 16:
        builtin.fused_experts_silu(x, topk_ids, topk_weights, prepared, out)
        return
    e = prepared.num_experts
    ids = torch.where(topk_ids < 0, topk_ids + e, topk_ids)  # -1 -> last expert
    k = ids.shape[1]
    w = topk_weights.clone()
    w[:, (k + 1) // 2:] = 0  # half of the experts skipped
    builtin.fused_experts_silu(x, ids, w, prepared, out)
