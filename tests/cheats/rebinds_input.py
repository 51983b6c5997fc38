"""Cheat: computes the right answer, then rebinds its input to another view (``as_strided_``),
so whoever holds the same tensor object afterwards sees a different shape and stride.

In-process the referee sees the change on its own tensor; in a worker only the worker's view
changed, which the worker reports and the referee translates: ``input_mutated`` either way, with
a message naming what changed (shape and stride here).
"""
import torch

SLOT = "activation.silu_and_mul"
CATCHES = ("input_mutated",)


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    x.as_strided_((x.numel(),), (1,))
