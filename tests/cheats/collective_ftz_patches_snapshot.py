"""Turns on flush-to-zero / denormals-are-zero at import and hides it from the rank's own numeric-state
snapshot: before it sets them it replaces ``numeric_state.snapshot`` (found by name in ``sys.modules``)
with one that answers the state from before. The rank's report then says nothing changed. Its
all-reduce is correct.

Only the referee's reading from outside the rank process sees it (every rank thread's MXCSR / FPCR
through ptrace, after every exchange): ``global_state_changed`` "read from outside".

Acts at import, so it must only ever be loaded inside a rank: tests read its constants from the source
(``tests.helpers.declared``) and hand the ranks its file, never importing it.
"""
import sys

import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"global_state_changed"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py, by file

for _name, _module in list(sys.modules.items()):
    if _name.endswith("numeric_state") and hasattr(_module, "snapshot"):
        _clean = _module.snapshot()
        _module.snapshot = lambda clean=_clean: dict(clean)
torch.set_flush_denormal(True)


def entry(x, out, group):
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
