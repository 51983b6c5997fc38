"""A correct all-reduce, then a thread that writes zeros into ``out`` 40 ms after entry returned (a
"deferred flush" that corrupts what the next layer reads in serving).

The referee compares right after the call, before the write lands. It then watches a settle window
and re-reads every tensor of every rank: the call left a thread it started alive, so the window is
the long one (``THREAD_SETTLE_S``), and the zeros show as ``late_write``.
"""
import threading
import time

import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def entry(x, out, group):
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    out.copy_(acc)

    def flush():
        time.sleep(0.04)
        out.zero_()

    threading.Thread(target=flush, name="deferred-flush", daemon=True).start()
