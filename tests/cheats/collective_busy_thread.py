"""A correct all-reduce, but a thread it started keeps computing after entry returns (work hidden
after the call, CPU taken from whatever the engine runs next).

The referee reads every rank thread's CPU time from outside (``/proc``) in the settle window after
the call: a thread that keeps using CPU fails ``thread_left_running``.
"""
import threading

import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def _spin():
    x = 0
    while True:
        x += 1


def entry(x, out, group):
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
    threading.Thread(target=_spin, name="after-return", daemon=True).start()
