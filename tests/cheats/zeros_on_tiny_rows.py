"""Writes the honest result, except zeros on rows whose magnitude a fixed atol would cover.

A row whose every cell is below the output dtype's default atol (bfloat16: 2e-2) passes a fixed
``|a - e| <= atol + rtol·|e|`` as all zeros: here the eps-dominated rows of
``tiny_values_eps_dominated`` (outputs near 1e-2). The comparators scale atol with each row's
magnitude (``atol·min(1, rms(row))``), so the zeroed rows fail ``compare``.
"""
import torch

from kernelslot.abi.comparators import default_tol
from kernelslot.kernels import norm as builtin

SLOT = "norm.rmsnorm"
CATCHES = {"compare", "replay"}


def entry(x, weight, out, eps):
    builtin.rmsnorm(x, weight, out, eps)
    tiny = out.float().abs().amax(-1) <= default_tol(out.dtype)  # zeros would pass a fixed atol here
    out[tiny] = 0
