"""Isolation cheat: spins waiting for a "device flag" that is never set (a hang).

Under the worker runner the per-call deadline fires, the worker is killed and the referee
reports the timeout.
"""
import time

SLOT = "norm.rmsnorm"
EXPECT = ("raised", "timeout")
_ready = [False]


def entry(x, weight, out, eps):
    while not _ready[0]:
        time.sleep(0.01)
    out.copy_(x)
