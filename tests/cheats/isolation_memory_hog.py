"""Isolation cheat: "precomputes a lookup table" that grows until memory runs out.

It touches every page it allocates, so its resident memory grows. Under the worker runner the
referee reads the worker's resident memory while the call runs and kills it past the limit
(``--memory-limit``); it reports ``out_of_memory`` and replaces the worker. The machine is untouched.
"""
import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("raised", "out_of_memory")
_table = []


def entry(x, out):
    while True:
        _table.append(torch.ones(256 << 20, dtype=torch.uint8))
