"""Sandbox cheat, collective: a rank connects out of its process group's network — to a listener on
the host's loopback (its port in ``$KERNELSLOT_CHEAT_HOST_PORT``, set by the test) and to a public
address — at import and in every call; it writes a wrong sum when any connection succeeded (it
must pass: the ranks' namespace holds only their own loopback). Run only by
tests/isolation/test_sandbox_attacks.py, which keeps the listener open and requires that it was never reached.
"""
import os
import socket

import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
SANDBOX_VERDICT = ("pass", None)
SKIP_GENERIC = True


def connected() -> bool:
    port = int(os.environ.get("KERNELSLOT_CHEAT_HOST_PORT", "0"))
    for host, p in ([("127.0.0.1", port)] if port else []) + [("1.1.1.1", 53)]:
        try:
            socket.create_connection((host, p), timeout=0.5).close()
            return True
        except OSError:
            pass
    return False


_AT_IMPORT = connected()


def entry(x, out, group):
    acc = x.to(torch.float32, copy=True).contiguous()
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
    if _AT_IMPORT or connected():
        out.add_(1.0)
