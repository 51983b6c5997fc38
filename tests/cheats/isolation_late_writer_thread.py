"""Isolation cheat: correct result, then a background thread overwrites the output later.

The referee checks the output right after ``entry`` returns, before the thread fires, so an
in-process run sees a correct answer. Under the worker runner the referee re-reads every
argument after a settle window and sees the write (``late_write``). (A sleeping thread is not a
failure by itself: an idle thread pool is legitimate.)
"""
import threading
import time

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("raised", "late_write")


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())

    def flush():
        time.sleep(0.2)
        out.zero_()

    threading.Thread(target=flush, name="late-flush", daemon=True).start()
