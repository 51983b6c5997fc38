"""Allocates and returns a replacement tensor instead of writing into out."""
import torch

SLOT = "activation.silu_and_mul"
CATCHES = {"returned_value"}


def entry(x, out):
    d = x.shape[-1] // 2
    return (torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float()).to(out.dtype)
