"""Isolation cheat: monkeypatches ``torch.allclose`` and the slot comparator to always pass, writes zeros.

In-process this would rewrite the referee's own judge. Under the worker runner the patch lands
in the worker's copy of the modules; the referee's comparator is untouched and compare fails.
"""
import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("compare", None)


def entry(x, out):
    from kernelslot.abi import comparators

    torch.allclose = lambda *a, **k: True
    comparators.AllClose.compare = lambda self, actual, expected: comparators.Verdict(True, "allclose", 1.0, 1.0)
    out.zero_()
