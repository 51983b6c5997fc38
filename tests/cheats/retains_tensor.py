"""Correct result, but keeps a view of the output alive across calls."""
import torch

SLOT = "activation.silu_and_mul"
CATCHES = {"retained_tensor"}
_kept = []


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    _kept.append(out[..., :1])
