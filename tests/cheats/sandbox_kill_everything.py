"""Sandbox cheat: at import and in its first call, kill every process it can see (its parent,
the zygote, sibling workers, the incumbent's worker, the referee) and signal everything
(``kill(-1)``): one bad bundle must not end the run that judges it.

Inside the sandbox's own PID namespace it sees only its own sandbox, whose init (the zygote)
ignores signals from inside: it kills at most its own spare worker, and its verdict is a normal
one (here: pass); the referee and the incumbent, in other PID namespaces, carry on.
Run only by tests/isolation/test_sandbox_attacks.py, and only inside a sandbox.
"""
import os
import signal

import torch

SLOT = "activation.silu_and_mul"
SANDBOX_VERDICT = ("pass", None)


def attack():
    if os.getpid() > 64:  # safety interlock: outside a fresh PID namespace this would take the host down
        return
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass


attack()


def entry(x, out):
    attack()
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
