"""Isolation cheat: correct result, but a thread it started keeps computing after ``entry`` returns
(work hidden from the timed window, or CPU stolen from the incumbent timed next to it).

Under the worker runner the referee reads every thread's CPU time from outside (``/proc``) in
the settle window after the call: a thread that keeps using CPU fails ``thread_left_running``.
(A thread that merely stays alive, idle, is fine: see tests/isolation/honest_kernels/idle_pool.py.)
"""
import threading

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("raised", "thread_left_running")


def _spin():
    x = 0
    while True:
        x += 1


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    threading.Thread(target=_spin, name="after-return", daemon=True).start()
