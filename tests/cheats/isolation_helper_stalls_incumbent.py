"""Isolation cheat: at import, start a helper process that burns CPU forever, so the incumbent,
timed next to the candidate (``--time``, candidate and incumbent interleaved), runs slower and
the candidate "wins" the speed comparison.

The helper is a process the candidate left running: the referee finds it in the sandbox's
process tree after the import request and fails ``process_left_running`` (killing it), so the
candidate fails instead of winning. The incumbent's worker lives in another sandbox, which
the helper cannot see or signal.
"""
import subprocess
import sys

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("raised", "process_left_running")
TIME = True  # run with timing: the stall must not turn into a win

_helper = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
