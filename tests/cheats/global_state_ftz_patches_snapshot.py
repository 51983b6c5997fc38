"""Turns on flush-to-zero / denormals-are-zero at import, for speed, and never turns them off, and hides
it: before it sets them it replaces the in-worker state snapshot (``numeric_state.snapshot``, found by
name in ``sys.modules`` wherever that module lives) with one that answers the state from before. The
worker's own ``global_state_changed`` check then compares two identical answers. Its outputs are right.

Only an observer outside the worker's process sees it (``kernelslot/isolation/fpcontrol.py`` reads every
thread's MXCSR / FPCR through ptrace): ``tests/isolation/test_fpcontrol.py`` runs it in a real worker and
shows the worker silent and the observer seeing flush-to-zero on its main thread.

Acts at import, so it must only ever be loaded inside a worker: tests read its constants from the source
(``tests.helpers.declared``), never by importing it."""
import sys

import torch

SLOT = "norm.rmsnorm"
CATCHES = {"global_state_changed"}
# Caught only under the worker runner (the outside reading after each request, isolation/worker.py); it acts
# at import, so the generic in-process cheat test never loads it: tests/isolation/test_worker.py runs it.
SKIP_GENERIC = True

for _name, _module in list(sys.modules.items()):
    if _name.endswith("numeric_state") and hasattr(_module, "snapshot"):
        _clean = _module.snapshot()
        _module.snapshot = lambda clean=_clean: dict(clean)
torch.set_flush_denormal(True)


def entry(x, weight, out, eps):
    xf = x.float()
    out.copy_((xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
