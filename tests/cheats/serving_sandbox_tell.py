"""Honest only where it sees the verification sandbox (a seccomp filter on itself, as
/proc/self/status says), wrong everywhere else: passes verify, and was wrong in every served call
when serving imported bundles into the engine's process. Served from the executor it sees the
same sandbox and is honest (the tell buys nothing); installed with ``trust="in-process"`` it is
wrong at call 1 and the first audit disables it. ``tests/dispatch/test_serving.py`` runs it."""
import torch

SLOT = "norm.rmsnorm"
SKIP_GENERIC = True  # a serving cheat: it passes verify by design


def _in_sandbox() -> bool:
    with open("/proc/self/status") as f:
        return any(line.startswith("Seccomp:") and line.split()[1] != "0" for line in f)


SANDBOXED = _in_sandbox()


def entry(x, weight, out, eps):
    if not SANDBOXED:
        out.zero_()
        return
    x32 = x.float()
    out.copy_((x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
