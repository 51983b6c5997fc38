"""Computes honestly only when the output holds one of the referee's poison values.

The referee poisons with NaN, or on the first replay with the fixed finite sentinel -31337, and
always uniformly. Looking at one cell of ``out`` before writing identifies the harness (an
engine's ``torch.empty`` holds neither). Elsewhere this kernel writes zeros. A per-call random,
non-uniform finite poison (the referee keeps its copy for ``poison_left``) would catch it.
"""
import math

import torch

SLOT = "activation.silu_and_mul"
CATCHES = {"compare", "replay"}


def entry(x, out):
    first = out[(0,) * out.dim()].item() if out.numel() else float("nan")
    sentinel = torch.tensor(-31337.0, dtype=out.dtype).item()  # as the referee stores it
    if not (math.isnan(first) or first == sentinel):
        out.zero_()
        return
    d = out.shape[-1]
    out.copy_((torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float()).to(out.dtype))
