"""An honest kernel; the manifest is what is broken."""
import torch


def silu_and_mul(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())

