"""The outside observer of floating-point control state (src/kernelslot/isolation/fpcontrol.py, issue 26 part 1):
it reads every thread of another process through ptrace, sees flush-to-zero that the process hides from its
own in-process snapshot, reads a clean process as clean, works on workers in every sandbox mode, stays
bounded on a process that cannot stop, and says why when ptrace is refused."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from kernelslot.isolation import fpcontrol
from kernelslot.isolation.fpcontrol import ARCH, DEFAULT_CONTROL, FpControl, ThreadFp, describe_control, diff, observe

REPO = Path(__file__).resolve().parents[2]
X86 = pytest.mark.skipif(ARCH != "x86_64", reason=f"the child programs set MXCSR through x86-64 glibc's fenv_t; this is {ARCH}")

# A child with N threads (main included) parked on an event; thread FTZ (if >= 0) sets flush-to-zero and
# denormals-are-zero through glibc's fenv_t (MXCSR at byte 28). Commands on stdin: "ping" -> "pong <n>"
# (n: threads started by the churn loop, when CHURN), anything else ends it.
_CHILD = r"""
import ctypes, os, sys, threading
N, FTZ, CHURN = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
libm = ctypes.CDLL("libm.so.6")
def set_ftz():
    buf = ctypes.create_string_buffer(64)
    libm.fegetenv(buf)
    raw = bytearray(buf.raw)
    raw[28:32] = (int.from_bytes(raw[28:32], "little") | 0x8040).to_bytes(4, "little")
    libm.fesetenv(ctypes.create_string_buffer(bytes(raw), 64))
go, ready, tids, churned = threading.Event(), threading.Barrier(N), {}, [0]
def work(i):
    tids[i] = threading.get_native_id()
    if i == FTZ:
        set_ftz()
    ready.wait()
    go.wait()
def churn():
    while not go.is_set():
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
        churned[0] += 1
threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(1, N)]
for t in threads:
    t.start()
ready.wait()
if CHURN:
    threading.Thread(target=churn, daemon=True).start()
print(" ".join(str(tids[i]) for i in range(1, N)), flush=True)
for line in sys.stdin:
    if line.strip() != "ping":
        break
    print("pong", churned[0], flush=True)
go.set()
"""


class _Child:
    def __init__(self, threads: int = 8, ftz_thread: int = -1, churn: bool = False):
        self.p = subprocess.Popen([sys.executable, "-c", _CHILD, str(threads), str(ftz_thread), "1" if churn else "0"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.tids = [int(t) for t in self.p.stdout.readline().split()]
        self.pid = self.p.pid

    def ping(self) -> int:
        self.p.stdin.write("ping\n")
        self.p.stdin.flush()
        return int(self.p.stdout.readline().split()[1])

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


@pytest.fixture
def child():
    made: list[_Child] = []

    def make(*args, **kwargs) -> _Child:
        made.append(_Child(*args, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _require_ptrace(reading: FpControl) -> None:
    if reading.error is not None and "not permitted" in reading.error:
        pytest.skip(f"ptrace is not available here: {reading.error}")


def _untraced(pid: int, tid: int) -> bool:
    """Thread ``tid`` has no tracer (or has exited meanwhile)."""
    return fpcontrol._status_field(fpcontrol._read(f"/proc/{pid}/task/{tid}/status"), "TracerPid") in ("0", "")


# -- decoding and comparing (no ptrace) ----------------------------------------------------------
def test_the_bits_decode_to_the_documented_fields():
    assert "default" in describe_control(DEFAULT_CONTROL["x86_64"], "x86_64")
    text = describe_control((0x033F, 0x9FC0), "x86_64")  # bit 15 FTZ, bit 6 DAZ
    assert "flush-to-zero on" in text and "denormals-are-zero on" in text and "0x9fc0" in text
    assert "rounding toward zero" in describe_control((0x033F, 0x1F80 | 0x6000), "x86_64")
    assert "rounding up" in describe_control((0x033F, 0x1F80 | 0x4000), "x86_64")
    assert "unmasked exceptions divide-by-zero" in describe_control((0x033F, 0x1F80 & ~0x200), "x86_64")
    assert "x87 precision 53-bit (double)" in describe_control((0x023F, 0x1F80), "x86_64")
    assert "x87 rounding down" in describe_control((0x073F, 0x1F80), "x86_64")
    assert "flush-to-zero on" in describe_control((1 << 24,), "aarch64")
    assert "rounding toward zero" in describe_control((3 << 22,), "aarch64")
    assert "trapped exceptions overflow" in describe_control((1 << 10,), "aarch64")
    assert "default" in describe_control((0,), "aarch64")


def test_registers_are_taken_from_the_kernel_layouts_without_the_sticky_flags():
    fx = bytearray(512)  # x86-64 user_fpregs_struct: cwd u16 at 0, mxcsr u32 at 24
    fx[0:2], fx[24:28] = (0x037F).to_bytes(2, "little"), (0x9FFF).to_bytes(4, "little")  # flags 0-5 set: ignored
    assert fpcontrol._control("x86_64", bytes(fx)) == (0x033F, 0x9FC0)
    simd = bytearray(528)  # aarch64 user_fpsimd_state: 32 x 16-byte vregs, fpsr u32, fpcr u32
    simd[512:516], simd[516:520] = (0x1F).to_bytes(4, "little"), (1 << 24).to_bytes(4, "little")
    assert fpcontrol._control("aarch64", bytes(simd)) == (1 << 24,)


def _reading(pid: int, **threads: tuple) -> FpControl:
    return FpControl(pid, "x86_64", {int(t[1:]): ThreadFp(int(t[1:]), "w", *v) for t, v in threads.items()})


def test_diff_names_each_changed_thread_and_field():
    clean, ftz = DEFAULT_CONTROL["x86_64"], (0x033F, 0x9FC0)
    cpus = frozenset({0, 1})
    before = _reading(10, t10=(clean, cpus, 0, "SCHED_OTHER"), t11=(clean, cpus, 0, "SCHED_OTHER"),
                      t12=(clean, cpus, 0, "SCHED_OTHER"))
    assert diff(before, before) == []
    after = _reading(10, t10=(clean, cpus, 0, "SCHED_OTHER"), t11=(ftz, cpus, 0, "SCHED_OTHER"),  # t12 exited: no change
                     t13=(ftz, frozenset({0}), 0, "SCHED_OTHER"), t14=(clean, cpus, 19, "SCHED_IDLE"))
    lines = diff(before, after)
    assert lines[0] == ("thread 11 'w': MXCSR 0x1f80 -> 0x9fc0 (flush-to-zero off -> on, denormals-are-zero off -> on)")
    assert lines[1].startswith("thread 13 'w' (started since the first reading): MXCSR 0x1f80 -> 0x9fc0")
    assert lines[2] == "thread 13 'w' (started since the first reading): CPU affinity 0-1 -> 0"
    assert lines[3:] == ["thread 14 'w' (started since the first reading): nice 0 -> 19",
                         "thread 14 'w' (started since the first reading): scheduling policy SCHED_OTHER -> SCHED_IDLE"]
    assert diff(FpControl(10, "x86_64", error="ptrace not permitted"), after) == []


# -- reading real processes ----------------------------------------------------------------------
@X86
def test_a_child_that_changes_nothing_reads_clean(child):
    c = child(8)
    first = observe(c.pid)
    _require_ptrace(first)
    assert first.observed and first.tids == tuple(sorted([c.pid, *c.tids])), first.describe()
    assert {t.control for t in first.threads.values()} == {DEFAULT_CONTROL[ARCH]}, first.describe()
    assert all(t.affinity and t.policy == "SCHED_OTHER" for t in first.threads.values())
    second = observe(c.pid)
    assert diff(first, second) == [] and second.tids == first.tids
    assert all(_untraced(c.pid, t) for t in first.tids)  # every thread was detached
    assert c.ping() == 0  # and runs on


@X86
def test_flush_to_zero_on_one_of_eight_threads_is_seen(child):
    clean = child(8)
    before = observe(clean.pid)
    _require_ptrace(before)
    c = child(8, ftz_thread=3)
    after = observe(c.pid)
    flushing = [t for t in after.threads.values() if t.control != DEFAULT_CONTROL[ARCH]]
    assert [t.tid for t in flushing] == [c.tids[2]], after.describe()  # thread 3 of 1..7
    assert "flush-to-zero on; denormals-are-zero on" in describe_control(flushing[0].control)
    # compared with the clean process's reading, as a per-call check compares with the worker's first one
    baseline = FpControl(c.pid, ARCH, {c.pid: before.threads[clean.pid]})
    expected = f"thread {c.tids[2]} {after.threads[c.tids[2]].name!r} (started since the first reading)"
    assert [line.split(":")[0] for line in diff(baseline, after)] == [expected]


@X86
def test_threads_that_start_and_exit_during_the_reads_do_not_break_them(child):
    c = child(4, churn=True)
    seen = set()
    for _ in range(30):
        r = observe(c.pid)
        _require_ptrace(r)
        assert r.error is None and r.elapsed_s < 0.5, r.describe()
        assert set(r.tids) >= {c.pid, *c.tids}
        assert all(t.control == DEFAULT_CONTROL[ARCH] for t in r.threads.values()), r.describe()
        seen.update(set(r.tids) - {c.pid, *c.tids})
    started = c.ping()
    assert started > 30 and seen, (started, seen)  # threads came and went while we read; the churning ones were read too
    time.sleep(0.05)
    assert c.ping() > started  # the loop still runs: nothing left stopped
    assert all(_untraced(c.pid, t) for t in fpcontrol._tasks(c.pid))


@X86
def test_a_stopped_process_is_read_and_stays_stopped(child):
    c = child(3, ftz_thread=1)
    os.kill(c.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while fpcontrol._read(f"/proc/{c.pid}/stat").split(") ")[1][0] != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    r = observe(c.pid)
    _require_ptrace(r)
    assert r.observed and sum(t.control != DEFAULT_CONTROL[ARCH] for t in r.threads.values()) == 1, r.describe()
    time.sleep(0.05)
    assert fpcontrol._read(f"/proc/{c.pid}/stat").split(") ")[1][0] == "T"  # still in its group stop
    os.kill(c.pid, signal.SIGCONT)
    assert c.ping() == 0


_FREEZER = Path("/sys/fs/cgroup/freezer")


@X86
@pytest.mark.skipif(not os.access(_FREEZER, os.W_OK), reason="needs a writable cgroup v1 freezer (/sys/fs/cgroup/freezer)")
def test_a_frozen_process_costs_the_time_limit_only_and_is_left_untraced(child):
    c = child(4)
    group = _FREEZER / f"kernelslot-fpcontrol-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(c.pid))
        (group / "freezer.state").write_text("FROZEN")
        while (group / "freezer.state").read_text().strip() != "FROZEN":
            time.sleep(0.01)
        start = time.perf_counter()
        r = observe(c.pid, timeout_s=0.1)
        took = time.perf_counter() - start
        _require_ptrace(r)
        assert took < 0.6 and not r.observed, (took, r.describe())
        assert all(t.control is None and t.note == "did not stop in time" for t in r.threads.values())
        assert "did not stop within the time limit" in r.notes[0]
        (group / "freezer.state").write_text("THAWED")
        assert c.ping() == 0  # it runs on: not left in a ptrace stop
        assert all(_untraced(c.pid, t) for t in fpcontrol._tasks(c.pid))
        assert observe(c.pid).observed
    finally:
        (group / "freezer.state").write_text("THAWED")
        c.close()
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.02)


def test_refusals_say_why():
    assert "own threads" in observe(os.getpid()).error
    assert observe(2 ** 22 + 12345).error == f"no process {2 ** 22 + 12345}"


_NOBODY = r"""
import importlib.util, json, subprocess, sys
spec = importlib.util.spec_from_file_location("fpcontrol", sys.argv[1])  # the file alone: kernelslot.isolation imports torch
fpcontrol = importlib.util.module_from_spec(spec)
sys.modules["fpcontrol"] = fpcontrol
spec.loader.exec_module(fpcontrol)
out = {}
for dumpable in (1, 0):
    p = subprocess.Popen([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(None).prctl(4, int(sys.argv[1])); "
                          "print(1, flush=True); sys.stdin.readline()", str(dumpable)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    out[dumpable] = fpcontrol.observe(p.pid).error
    p.stdin.close()
    p.wait()
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK),
                    reason="needs root (to run an observer as another user) and /usr/bin/python3")
def test_an_unprivileged_observer_is_told_why_a_non_dumpable_process_is_refused():
    """As sandbox mode none is for an unprivileged referee: its workers are non-dumpable and in no user
    namespace of its own, so ptrace needs CAP_SYS_PTRACE. A dumpable process of the same user is read."""
    module = REPO / "src" / "kernelslot" / "isolation" / "fpcontrol.py"
    done = subprocess.run(["/usr/bin/python3", "-c", _NOBODY, str(module)], capture_output=True, text=True,
                          user=65534, group=65534, extra_groups=[], cwd="/", timeout=30)
    errors = json.loads(done.stdout or "{}") if done.returncode == 0 else pytest.fail(done.stderr)
    assert errors["1"] is None
    assert errors["0"].startswith("ptrace not permitted (EPERM): the target is not dumpable"), errors["0"]
    assert "CAP_SYS_PTRACE" in errors["0"]


@pytest.mark.skipif(ARCH != "aarch64", reason="FPCR is read through NT_PRFPREG (user_fpsimd_state) on aarch64 only; "
                                               f"this machine is {ARCH}, so only the decoding above is tested here")
def test_fpcr_flush_to_zero_is_seen_on_aarch64():
    code = ("import ctypes, sys; libm = ctypes.CDLL('libm.so.6'); b = ctypes.create_string_buffer(64); libm.fegetenv(b); "
            "r = bytearray(b.raw); r[0:4] = (int.from_bytes(r[0:4], 'little') | 1 << 24).to_bytes(4, 'little'); "
            "libm.fesetenv(ctypes.create_string_buffer(bytes(r), 64)); print(1, flush=True); sys.stdin.readline()")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        p.stdout.readline()
        r = observe(p.pid)
        _require_ptrace(r)
        assert r.threads[p.pid].control == (1 << 24,), r.describe()
    finally:
        p.kill()
        p.wait()


# -- inside the project's sandbox ---------------------------------------------------------------
# A sandboxed process as the zygote makes workers: confined, not dumpable; then torch, the in-process
# snapshot replaced by one that answers the state from before (what a hostile kernel does), and
# torch.set_flush_denormal(True) on thread 3 of 8 while the in-process Guard watches.
_SANDBOXED = r"""
import ctypes, json, os, sys, threading
sys.path[:0] = json.loads(sys.argv[3])
from kernelslot.isolation.sandbox import confine
confine(sys.argv[1], sys.argv[2])
ctypes.CDLL(None).prctl(4, 0)
import torch
from kernelslot.isolation import numeric_state
clean = numeric_state.snapshot()
numeric_state.snapshot = lambda: dict(clean)
tids, ready, flip, flipped, end = {}, threading.Barrier(8), threading.Event(), threading.Event(), threading.Event()
def work(i):
    tids[i] = threading.get_native_id()
    ready.wait()
    if i == 3:
        flip.wait()
        torch.set_flush_denormal(True)
        flipped.set()
    end.wait()
for i in range(1, 8):
    threading.Thread(target=work, args=(i,), daemon=True).start()
ready.wait()
print(os.getpid(), flush=True)
sys.stdin.readline()
with numeric_state.Guard() as guard:
    flip.set()
    flipped.wait()
print(json.dumps({"inside": guard.changed, "tid": tids[3]}), flush=True)
sys.stdin.readline()
end.set()
"""


@X86
@pytest.mark.parametrize("mode", ["bwrap", "unshare", "none"])
def test_a_sandboxed_process_hiding_flush_to_zero_from_its_snapshot_is_seen(mode):
    from kernelslot.isolation import proctree, sandbox

    try:
        box = sandbox.select(mode)
    except sandbox.SandboxUnavailable as exc:
        pytest.skip(str(exc))
    scratch = tempfile.mkdtemp()
    p = box.popen([sys.executable, "-c", _SANDBOXED, mode, scratch, json.dumps([x for x in sys.path if x])],
                  scratch_dir=scratch, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ns_pid = int(p.stdout.readline())
        pid = next(q.pid for q in proctree.tree(p.pid) if q.ns_pid == ns_pid and q.name.startswith("python"))
        before = observe(pid)
        _require_ptrace(before)
        assert before.observed and len(before.threads) >= 8, before.describe()
        assert {t.control for t in before.threads.values()} == {DEFAULT_CONTROL[ARCH]}, before.describe()
        p.stdin.write("\n")
        p.stdin.flush()
        told = json.loads(p.stdout.readline())
        assert told["inside"] == []  # the in-process check sees nothing: its snapshot was replaced
        after = observe(pid)
        changed = diff(before, after)
        assert len(changed) == 1 and "flush-to-zero off -> on, denormals-are-zero off -> on" in changed[0], changed
        tid = int(changed[0].split()[1])
        assert proctree.ns_pid(tid) == told["tid"]  # the very thread that set it (its pid inside the sandbox)
    finally:
        p.kill()
        p.wait(10)
        shutil.rmtree(scratch, ignore_errors=True)


@X86
def test_a_worker_running_the_cheat_is_silent_inside_and_seen_outside():
    """The real worker (make_runner(True): zygote, sandbox, PR_SET_DUMPABLE 0) loads
    tests/cheats/global_state_ftz_patches_snapshot.py: the worker's own check reports nothing, the
    runner's outside reading sees flush-to-zero on the worker's main thread (and replaces the worker);
    the next worker reads clean."""
    from kernelslot.slots import Kernel, get_slot
    from kernelslot.slots.base import KernelSource
    from kernelslot.isolation import make_runner

    source = KernelSource(entry="entry", file=str(REPO / "tests" / "cheats" / "global_state_ftz_patches_snapshot.py"))
    cheat = Kernel(None, None, name="cheat", source=source)
    x, w, out = torch.randn(4, 64), torch.rand(64) + 0.5, torch.empty(4, 64)
    runner = make_runner(True, 20.0)
    try:
        runner.share([x, w, out])
        obs = runner.call(cheat, [x, w, out, 1e-6])
        if runner.fp_unobserved:
            pytest.skip(f"ptrace refused here: {runner.fp_unobserved}")
        assert obs.error is None and len(obs.state_changed) == 1, (obs.error, obs.state_changed)
        text = obs.state_changed[0]
        assert "read from outside the worker" in text and "own snapshot reported no change" in text, text
        assert "flush-to-zero off -> on, denormals-are-zero off -> on" in text, text
        honest = runner.call(get_slot("norm.rmsnorm").incumbent, [x, w, out, 1e-6])  # another source: a fresh worker
        assert honest.error is None
        clean = observe(runner._proc.pid)
        assert clean.observed and {t.control for t in clean.threads.values()} == {DEFAULT_CONTROL[ARCH]}, clean.describe()
    finally:
        runner.close()

