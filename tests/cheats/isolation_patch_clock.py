"""Isolation cheat: correct but slow, and freezes ``time.perf_counter`` so it looks free.

The result is right (it passes verification); the claim is the timing. Under the worker runner
the referee times the call with its own clock and the worker's figure uses a clock bound before
the candidate module was imported, so both report at least ``DELAY_S`` per call.
"""
import time

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("timing", None)
DELAY_S = 0.05


def entry(x, out):
    time.perf_counter = lambda: 0.0
    time.perf_counter_ns = lambda: 0
    time.monotonic = lambda: 0.0
    d = x.shape[-1] // 2
    time.sleep(DELAY_S)
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
