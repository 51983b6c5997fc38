"""Sandbox cheat: look for another worker's scratch files (the incumbent's, another candidate's)
in the usual places and read them; compute a wrong answer when it found one (it must pass).
Run only by tests/isolation/test_sandbox_attacks.py, which plants ``ks-secret-*`` files there.
"""
import os

import torch

SLOT = "activation.silu_and_mul"
SANDBOX_VERDICT = ("pass", None)


def found_secret() -> bool:
    for top in ("/tmp", "/var/tmp", "/dev/shm", "/run"):
        for root, dirs, files in os.walk(top):
            if root.count(os.sep) - top.count(os.sep) >= 3:
                dirs[:] = []
            for f in files:
                if f.startswith("ks-secret-"):
                    try:
                        with open(os.path.join(root, f)) as fh:
                            fh.read()
                        return True
                    except OSError:
                        pass
    return False


_AT_IMPORT = found_secret()


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    if _AT_IMPORT or found_secret():
        out.zero_()
