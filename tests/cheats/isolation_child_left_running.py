"""Isolation cheat: correct result, and a child process that outlives the call, detached twice
(its own session, then orphaned), to keep working after ``entry`` returned.

The worker's zygote is a child subreaper (or its PID namespace's init), so the orphan stays in
the sandbox's process tree; the referee lists that tree from outside after every request and
fails ``process_left_running`` (and kills the process) when anything but the workers is left.
"""
import subprocess
import sys

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("raised", "process_left_running")


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    subprocess.Popen([sys.executable, "-c", "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"],
                     start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
