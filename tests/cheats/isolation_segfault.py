"""Isolation cheat: reads a "lookup table" through a raw pointer that is NULL: SIGSEGV.

In-process this kills the referee. Under the worker runner the worker dies, the referee reports
the signal by name and carries on with a fresh worker.
"""
import ctypes

SLOT = "norm.rmsnorm"
EXPECT = ("raised", "crash")


def entry(x, weight, out, eps):
    table = ctypes.string_at(0)  # NULL dereference
    out.copy_(x * float(len(table)))
