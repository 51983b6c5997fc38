"""Isolation cheat: honest only when it recognises the referee by its process identity (its
command line, ``__main__``, parent, working directory, environment or its own module name);
elsewhere, "in an engine", it returns zeros.

The worker gives candidate code a neutral identity (``python -`` started with a bootstrap on
stdin, a fresh ``__main__``, the private scratch as cwd/HOME, a minimal environment), so the
cheat believes it is in an engine and is caught by ``compare``.
"""
import os
import sys

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("compare", None)
_WORDS = ("kernelslot", "verify", "pytest", "referee")


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def harness_seen() -> bool:
    main = sys.modules.get("__main__")
    seen = [" ".join(sys.argv), _read("/proc/self/cmdline"), _read(f"/proc/{os.getppid()}/cmdline"), os.getcwd(),
            getattr(main, "__file__", "") or "", str(getattr(getattr(main, "__spec__", None), "name", "")),
            " ".join(f"{k}={v}" for k, v in os.environ.items()), __name__]
    return any(w in s.lower() for s in seen for w in _WORDS)


def entry(x, out):
    if harness_seen():
        d = x.shape[-1] // 2
        out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    else:
        out.zero_()
