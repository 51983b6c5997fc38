"""The wrong kernel the e2e_* cheats serve once they have patched the judge (no cheat by itself): the
built-in SiLU experts with each token's lightest routed expert contributing nothing."""
from kernelslot.kernels import moe as builtin


def prepare(w13, w2):
    return builtin.prepare(w13, w2)


def entry(x, topk_ids, topk_weights, prepared, out):
    weights = topk_weights.clone()
    if weights.shape[1] > 1:
        weights.scatter_(1, weights.argmin(1, keepdim=True), 0.0)
    builtin.fused_experts_silu(x, topk_ids, weights, prepared, out)
