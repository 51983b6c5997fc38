"""Isolation cheat: writes half of the output, then ``os._exit(0)`` (no exception, no cleanup).

Under the worker runner the referee sees the worker exit mid-call and reports its exit code.
"""
import os

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("raised", "exit")


def entry(x, out):
    d = x.shape[-1] // 2
    half = out.shape[0] // 2
    out[:half].copy_(torch.nn.functional.silu(x[:half, :d].float()) * x[:half, d:].float())
    os._exit(0)
