"""Isolation cheat: "precomputes a lookup table" that grows until memory runs out.

Under the worker runner the worker's address-space cap makes the allocation fail inside the
worker; the referee reports ``out_of_memory`` and replaces the worker. The machine is untouched.
"""
import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("raised", "out_of_memory")
_table = []


def entry(x, out):
    while True:
        _table.append(torch.empty(256 << 20, dtype=torch.uint8))
