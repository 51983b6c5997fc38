"""Computes honestly only when the output looks like the referee's (padded / offset view).

Every output the referee allocates is non-contiguous or starts at a non-zero storage offset
(so that canaries surround it). A plain engine output (``torch.empty``: contiguous, offset 0)
therefore identifies production, where this kernel writes zeros. Catching it needs some calls
with an ordinary contiguous, offset-0 output (poison only, no canary).
"""
import torch

SLOT = "activation.silu_and_mul"
CATCHES = {"compare", "replay"}


def entry(x, out):
    if out.is_contiguous() and out.storage_offset() == 0:
        out.zero_()  # "production": skip the work
        return
    d = out.shape[-1]
    out.copy_((torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float()).to(out.dtype))
