"""Assumes balanced routing: each expert takes at most twice its balanced share of tokens.

A capacity-based kernel sizes each expert's batch as ``ceil(2·M·K/E)`` (a capacity factor of
2, as in token-dropping MoE training code) and drops the (token, expert) pairs past it. Random
routing never comes near that bound on any profile; a hot expert that every token picks does
(``skew_*`` profiles of ``moe.fused_experts``: 16 tokens over capacity of 64).

Verify with ``VerifyOptions(model=MODEL)`` (SiLU experts only).
"""
import math

import torch

from kernelslot.kernels import moe as builtin

SLOT = "moe.fused_experts"
MODEL = "generic"
CATCHES = {"compare"}
CAPACITY_FACTOR = 2.0


def prepare(w13, w2):
    return builtin.prepare(w13, w2)


def entry(x, topk_ids, topk_weights, prepared, out):
    m, k = topk_ids.shape
    capacity = math.ceil(CAPACITY_FACTOR * m * k / prepared.num_experts)
    ids = topk_ids.clone()
    flat = ids.view(-1)  # token-major: earlier tokens keep their place in an expert's batch
    for e in flat[flat >= 0].unique().tolist():
        where = (flat == e).nonzero().flatten()
        flat[where[capacity:]] = -1  # over capacity: dropped
    builtin.fused_experts_silu(x, ids, topk_weights, prepared, out)
