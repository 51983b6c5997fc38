"""Broken on purpose: writes the result and also returns it (entries must return None)."""
import torch


def silu_and_mul(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    return out
