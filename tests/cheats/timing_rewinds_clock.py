"""Right answers, impossible times: an in-process candidate rewinds the clock that times it.

The in-process runner reads ``time.perf_counter`` around the call (and a referee that bound its
clock at import keeps it in its module globals, reachable from the caller's frame). This kernel
notes when its caller started the clock (the caller's ``start``, else the real time when it is
entered), does the work honestly, then swaps every clock it can reach for a one-shot function
that answers that time and puts the real clock back. The call appears to take no time at all,
every check passes, and ``--time`` used to report
the speedup. Nothing about the result is wrong: only the physics floor (``verify/single/roofline.py``:
the bytes this call must move at the most this machine can move them) catches it, whatever the
mechanism that produced the time (a lying clock, work done outside the timed window).
"""
import sys
import time

import torch

SLOT = "norm.rmsnorm"
CATCHES = {"time_impossible"}
OPTIONS = {"time": True, "extra_mean": 0.0, "profiles": ("decode_batch",)}
_real = time.perf_counter


def _rewind(entered: float) -> None:
    frame = sys._getframe(2)  # the runner's call
    caller = frame.f_globals  # the runner's module: its clock, if it keeps one
    entered = frame.f_locals.get("start", entered)

    def once() -> float:
        time.perf_counter = _real
        for name in bound:
            caller[name] = _real
        return entered

    bound = [name for name, value in caller.items() if value is _real]
    time.perf_counter = once
    for name in bound:
        caller[name] = once


def entry(x, weight, out, eps):
    entered = _real()
    x32 = x.float()
    out.copy_((x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
    _rewind(entered)
