"""Sandbox cheat: open a network connection (to every TCP listener it can find on this machine,
then to a public address); compute a wrong answer when any connection succeeded (it must pass).
Run only by tests/isolation/test_sandbox_attacks.py, which keeps a listener open on 127.0.0.1.
"""
import socket

import torch

SLOT = "activation.silu_and_mul"
SANDBOX_VERDICT = ("pass", None)


def listeners():
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                for line in f.readlines()[1:]:
                    local, state = line.split()[1], line.split()[3]
                    if state == "0A":  # LISTEN
                        ports.add(int(local.rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return sorted(ports)


def connected() -> bool:
    for host, port in [("127.0.0.1", p) for p in listeners()] + [("1.1.1.1", 53)]:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return True
        except OSError:
            pass
    return False


_AT_IMPORT = connected()


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    if _AT_IMPORT or connected():
        out.zero_()
