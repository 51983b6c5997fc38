"""Isolation cheat: like ``isolation_late_writer_thread`` but with a raw ``_thread`` the
``threading`` module does not list, writing 50 ms after ``entry`` returned.

The worker cannot see the thread; the referee's settle re-read (``late_write``) catches the
write. If the write lands before the referee's first read, the zeros fail compare instead.
"""
import _thread
import time

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("raised", "late_write")


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())

    def flush():
        time.sleep(0.05)
        out.zero_()

    _thread.start_new_thread(flush, ())
