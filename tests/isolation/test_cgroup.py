"""Kernel-enforced worker caps (isolation/cgroup.py): memory.max kills a process that touches more than
its cap and not one that only reserves; pids.max stops thread and fork bombs; groups are removed.
Skipped where this host lets the referee make no cgroup (then memory is polled, test_worker.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kernelslot.isolation import cgroup

CAP = 256 << 20
SRC = str(Path(cgroup.__file__).resolve().parents[2])


@pytest.fixture
def hierarchy():
    h = cgroup.hierarchy()
    if h is None:
        assert cgroup.why_not()  # the receipt says why the poll is in force
        assert "polled from /proc" in cgroup.describe(CAP)
        pytest.skip(f"no writable cgroup here: {cgroup.why_not()}")
    assert h.describe() in cgroup.describe(CAP)
    return h


def _run_capped(h, code: str, max_tasks: int = 64) -> tuple[int, int]:
    cap = cgroup.Cap(h, CAP, max_tasks)
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", "import sys; sys.stdin.read(1)\n" + code],
                                stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
        cap.add(proc.pid)  # before it runs the code under test
        proc.stdin.close()
        return proc.wait(timeout=60), cap.oom_kills()
    finally:
        dirs = list(cap.dirs)
        cap.close()
        assert not any(os.path.exists(d) for d in dirs)


def test_touching_more_than_the_cap_is_killed_by_the_kernel(hierarchy):
    assert _run_capped(hierarchy, f"b = bytearray({2 * CAP})") == (-9, 1)


def test_an_untouched_reservation_is_not_charged(hierarchy):
    code = f"import mmap; m = mmap.mmap(-1, {16 * CAP}); m[0] = 1; m[-1] = 1"  # 4 GiB mapped, two pages touched
    assert _run_capped(hierarchy, code) == (0, 0)


def test_the_task_cap_stops_a_thread_bomb(hierarchy):
    if not hierarchy.pids_dir:
        pytest.skip("no pids controller in this hierarchy")
    code = "import threading, time\n[threading.Thread(target=time.sleep, args=(5,), daemon=True).start() for _ in range(40)]"
    rc, _ = _run_capped(hierarchy, code, max_tasks=8)
    assert rc == 1  # RuntimeError: can't start new thread


_CONFINE = r"""
import sys
sys.path[:0] = [{src!r}]
from kernelslot.isolation import sandbox
sandbox.confine({mode!r}, {scratch!r})
"""
_RAISE_OWN_CAP = r"""
import os
for d in {dirs!r}:
    for name in ("memory.max", "memory.limit_in_bytes", "pids.max", "cgroup.procs"):
        if os.path.exists(os.path.join(d, name)):
            try:
                open(os.path.join(d, name), "w").write("max")
                print("wrote", name)
            except OSError as exc:
                print("refused", name, exc.strerror)
"""


@pytest.mark.parametrize("mode", ["bwrap", pytest.param("unshare", marks=pytest.mark.slow)])
def test_a_sandboxed_worker_cannot_raise_its_own_cap(hierarchy, mode):
    from kernelslot.isolation import sandbox

    try:
        box = sandbox.select(mode)
    except sandbox.SandboxUnavailable:
        pytest.skip(f"sandbox {mode} is not available here")
    cap = cgroup.Cap(hierarchy, CAP, 64)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            confine = _CONFINE.format(src=SRC, mode=mode, scratch=scratch) if mode != "bwrap" else ""  # bwrap: nothing to do
            code = confine + _RAISE_OWN_CAP.format(dirs=cap.dirs)
            proc = box.popen([sys.executable, "-c", code], scratch_dir=scratch, stdout=subprocess.PIPE, text=True)
            out = proc.communicate(timeout=60)[0].split("\n")
    finally:
        cap.close()
    assert proc.returncode == 0 and len([ln for ln in out if ln]) >= 3, out
    assert all(ln.startswith("refused") and "Read-only" in ln for ln in out if ln), out


def test_receipts_say_how_memory_is_capped():
    from types import SimpleNamespace

    from kernelslot.verify.integrity import run_provenance

    assert run_provenance(SimpleNamespace(memory_bytes=CAP))["memory_cap"] == cgroup.describe(CAP)
    assert run_provenance(SimpleNamespace(memory_bytes=0))["memory_cap"].startswith("no memory cap")
    assert "in the referee" in run_provenance(object())["memory_cap"]


@pytest.mark.slow  # a worker's zygote start (~5 s); the default suite runs the hog under whichever cap is in force
def test_without_cgroups_the_poll_still_contains_a_memory_hog(monkeypatch):
    import torch

    from kernelslot.slots import Candidate, Kernel, get_slot
    from kernelslot.slots.base import KernelSource
    from kernelslot.verify import VerifyOptions, verify_slot
    from kernelslot.isolation.worker import WorkerRunner

    monkeypatch.setenv("KERNELSLOT_CGROUP", "none")
    cgroup.hierarchy.cache_clear()
    try:
        assert cgroup.hierarchy() is None and "polled" in cgroup.describe(CAP)
        hog = KernelSource(entry="entry", file=os.path.join(os.path.dirname(__file__), "..", "cheats", "isolation_memory_hog.py"))
        defn = get_slot("activation.silu_and_mul")
        with WorkerRunner(call_timeout_s=20.0, prepare_timeout_s=30.0, memory_limit_gib=0.5) as runner:
            report = verify_slot(defn, Candidate(Kernel(None, None, name="hog", source=hog)),
                                 VerifyOptions(dtypes=(torch.float32,), profiles=("decode_batch",)), runner=runner)
        raised = report.results[0].check("raised")
        assert raised.status == "fail" and raised.message.startswith("[out_of_memory] resident memory"), raised.message
        assert "exceeded the limit of 0.50 GiB" in raised.message
    finally:
        cgroup.hierarchy.cache_clear()
