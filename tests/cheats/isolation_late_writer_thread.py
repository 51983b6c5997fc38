"""Isolation cheat: correct result, then a background thread overwrites the output later.

The referee checks the output right after ``entry`` returns, before the thread fires, so an
in-process run sees a correct answer. Under the worker runner the worker notices a thread the
call started that is still running when it returns (``thread_left_running``).
"""
import threading
import time

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("raised", "thread_left_running")


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())

    def flush():
        time.sleep(0.2)
        out.zero_()

    threading.Thread(target=flush, name="late-flush", daemon=True).start()
