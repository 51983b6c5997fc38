"""Defers the write: each call flushes the previous call's output and keeps the new one pending."""
import torch

SLOT = "activation.silu_and_mul"
CATCHES = {"poison_left", "retained_tensor"}
_pending = []


def entry(x, out):
    d = x.shape[-1] // 2
    for target, value in _pending:
        target.copy_(value)
    _pending.clear()
    _pending.append((out, torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float()))
