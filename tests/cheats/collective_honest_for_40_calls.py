"""An all-reduce honest for the first 40 calls of each (shape, dtype) in its rank process, then
stale: it writes its input unreduced. The collective twin of ``honest_for_40_calls.py``.

A profile run's ordinary plan makes about ten calls; what catches it is the secret long run
(``verify/plan.py``, ``long_run``; on for bundles), which the collective referee gives one profile
run of each slot verification, as the single-device pipeline does. Rank processes live across
profile runs (and tests, where sessions are pooled), so the count is per process: the test runs
it in sessions of its own.
"""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"replay"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py
HONEST_CALLS = 40
_calls: dict = {}


def entry(x, out, group):
    key = (tuple(x.shape), str(x.dtype))
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] > HONEST_CALLS:
        out.copy_(x)
        return
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
