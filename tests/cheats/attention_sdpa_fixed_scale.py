"""Ignores the validator's sm_scale and hard-codes 1/sqrt(D)."""
from kernelslot.kernels.attention import sdpa

SLOT = "attention.sdpa"
CATCHES = {"compare"}


def entry(q, k, v, out, sm_scale, causal):
    sdpa(q, k, v, out, q.shape[-1] ** -0.5, causal)
