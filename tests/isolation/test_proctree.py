"""proctree.pinned: a timed step's calling thread on one CPU, every mask put back afterwards."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kernelslot.isolation import proctree

CPUS = os.sched_getaffinity(0)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to tell a pinned thread from a free one")
def test_pinned_puts_the_main_thread_on_one_cpu_and_every_mask_back():
    # a child that starts a thread when told to (stdin), as a pool first used inside a timed step would
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, threading, time\n"
        "sys.stdin.readline()\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "print('started', flush=True)\n"
        "time.sleep(30)\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.2)
        cpu = proctree.timed_cpu()
        assert cpu == max(CPUS)
        with proctree.pinned(child.pid, cpu):
            assert os.sched_getaffinity(child.pid) == {cpu}
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "started"
            made = [int(t) for t in os.listdir(f"/proc/{child.pid}/task") if int(t) != child.pid]
            assert made and all(os.sched_getaffinity(t) == {cpu} for t in made)  # inherited: the case to undo
        assert os.sched_getaffinity(child.pid) == CPUS
        assert all(os.sched_getaffinity(t) == CPUS for t in made)
    finally:
        child.kill()
        child.wait()


def test_pinned_on_a_gone_process_runs_the_block_unpinned():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    ran = []
    with proctree.pinned(child.pid, proctree.timed_cpu()):
        ran.append(True)
    assert ran == [True]
