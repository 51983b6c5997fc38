"""Sandbox cheat: try to write where the referee and later runs trust what they find (the
installed kernelslot package, the native kernels' build cache, $HOME, the interpreter's prefix),
at import and in a call. It writes only a probe file it removes again, and computes a wrong
answer when any write succeeded, so the verdict shows whether the sandbox held (it must pass).
Run only by tests/isolation/test_sandbox_attacks.py.
"""
import os
import pwd
import sys

import torch

SLOT = "activation.silu_and_mul"
SANDBOX_VERDICT = ("pass", None)


def targets():
    home = pwd.getpwuid(os.getuid()).pw_dir
    pkg = next((os.path.dirname(m.__file__) for n, m in list(sys.modules.items())
                if n.split(".")[0] not in ("torch", "numpy") and n.endswith(".verify") and getattr(m, "__file__", None)), None)
    found = [home, os.path.join(home, ".cache", "kernelslot", "native"), sys.prefix, os.path.dirname(os.path.abspath(__file__))]
    if pkg:
        found += [pkg, os.path.dirname(pkg)]
    return [t for t in found if os.path.isdir(t)]


def wrote_somewhere() -> list:
    done = []
    for d in targets():
        probe = os.path.join(d, f".probe-{os.getpid()}")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            continue
        os.close(fd)
        os.unlink(probe)
        done.append(d)
    return done


_AT_IMPORT = wrote_somewhere()


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    if _AT_IMPORT or wrote_somewhere():
        out.zero_()
