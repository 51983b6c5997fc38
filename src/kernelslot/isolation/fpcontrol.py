"""Floating-point control state of another process's threads, read from outside it (issue 26, part 1).

The in-worker snapshot (``isolation/numeric_state.py``) runs in the candidate's own process, so a
candidate that sets flush-to-zero and replaces the snapshot function hides it. This module is the
referee's side: :func:`observe` reads, from the referee's process and without any cooperation of
the observed one, every thread's floating-point control register through ``ptrace``, and
:func:`diff` says what changed between two readings.

How a reading is made (:func:`observe`), all with ctypes, in a short-lived thread of the caller's
process (a ptrace tracer is a thread):

1. list ``/proc/PID/task``; ``PTRACE_SEIZE`` and ``PTRACE_INTERRUPT`` every thread; wait
   (``waitpid(tid, __WALL | WNOHANG)``, polled) until each is in its ptrace stop; list again and do
   the same for threads that appeared meanwhile, until a listing shows none new: then no thread of
   the process runs, so none can start another, and the reading is one consistent instant;
2. read each stopped thread's floating-point registers with ``PTRACE_GETREGSET(NT_PRFPREG)``:
   on x86-64 the FXSAVE area (``user_fpregs_struct``: x87 control word at byte 0, MXCSR at 24), on
   aarch64 ``user_fpsimd_state`` (FPCR at byte 516);
3. ``PTRACE_DETACH`` every thread (a signal that arrived meanwhile is delivered on detach; a
   thread that was in a group stop, e.g. ``SIGSTOP``, stays stopped).

Bounded: threads that do not reach their stop by ``timeout_s`` (a frozen cgroup, an uninterruptible
sleep) are reported without a value, and the tracer thread then exits, which makes the kernel
detach every tracee it still holds, so nothing is left stopped or traced. Threads that exit during
the reading are left out (counted in ``FpControl.exited``). Each stop wakes the observed thread
once and sends ``SIGCHLD`` to the observer's process (ignored by default); as after ``SIGSTOP`` /
``SIGCONT``, the few blocking calls Linux does not restart (``epoll_wait``, ``sigtimedwait``,
``semop``, ...) may return ``EINTR`` in the observed process, which Python retries (PEP 475).

Compared (control bits only; the sticky exception flags change with ordinary arithmetic):

* x86-64: MXCSR bits 6-15 (denormals-are-zero 6, exception masks 7-12, rounding 13-14,
  flush-to-zero 15) and the x87 control word's masks (0-5), precision (8-9) and rounding (10-11);
* aarch64: FPCR (flush-to-zero 24, default NaN 25, alternative half precision 26, rounding 22-23,
  half-precision flush-to-zero 19, trap enables 8-12 and 15);
* per thread, also without ptrace: the CPU affinity (``sched_getaffinity``), nice value and
  scheduling policy, which change what every later computation of the process costs.

What is not read from outside: torch's and OpenMP's thread-count settings and torch's precision
flags live in library variables that are not exported; only the number of threads is (``tids``).

Permission: tracing needs the kernel's ``ptrace_may_access`` (same user, or ``CAP_SYS_PTRACE`` in
the target's user namespace, which is required anyway for a non-dumpable target such as a worker
after ``PR_SET_DUMPABLE 0``), Yama's ``ptrace_scope`` and no seccomp filter or LSM of the
referee's own denying it. A sandboxed worker (bwrap/unshare) lives in a user namespace the
referee's user owns, so the referee holds ``CAP_SYS_PTRACE`` there even unprivileged. When tracing
is refused, :func:`observe` returns a reading with ``error`` saying why, for the caller to record
"not observed" rather than fail.
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["ThreadFp", "FpControl", "observe", "diff", "describe_control", "DEFAULT_CONTROL"]

ARCH = platform.machine()
DEFAULT_CONTROL = {"x86_64": (0x033F, 0x1F80), "aarch64": (0x0,)}  # a fresh process's control bits (x87 CW 0x037f)

_PTRACE_DETACH, _PTRACE_GETREGSET, _PTRACE_SEIZE, _PTRACE_INTERRUPT = 17, 0x4204, 0x4206, 0x4207
_PTRACE_EVENT_STOP = 128
_NT_PRFPREG = 2
_WALL = 0x40000000
_FPREGS_BYTES = {"x86_64": 512, "aarch64": 528}
_MXCSR_CONTROL, _X87_CONTROL = 0xFFC0, 0x0F3F  # MXCSR without the sticky flags 0-5; CW without reserved bits
_POLICIES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE", 6: "SCHED_DEADLINE"}
_REGISTERS = {"x86_64": ("x87 control", "MXCSR"), "aarch64": ("FPCR",)}
_EXCEPTIONS = ("invalid", "denormal", "divide-by-zero", "overflow", "underflow", "inexact")


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, tid: int, addr: int | None = None, data: int | ctypes.c_void_p | None = None) -> int:
    """``ptrace(request, tid, addr, data)``; 0 on success, else the errno."""
    return 0 if _libc.ptrace(request, tid, addr, data) != -1 else ctypes.get_errno()


# -- decoding ----------------------------------------------------------------------------------
def _fields(arch: str, control: tuple[int, ...]) -> dict[str, str]:
    """The control state as named, readable fields (compared field by field in :func:`diff`)."""
    on = lambda value, bit: "on" if value >> bit & 1 else "off"  # noqa: E731
    if arch == "x86_64":
        x87, mxcsr = control
        unmasked = [n for i, n in enumerate(_EXCEPTIONS) if not mxcsr >> (7 + i) & 1]
        x87_unmasked = [n for i, n in enumerate(_EXCEPTIONS) if not x87 >> i & 1]
        return {"flush-to-zero": on(mxcsr, 15), "denormals-are-zero": on(mxcsr, 6),
                "rounding": ("to nearest", "down", "up", "toward zero")[mxcsr >> 13 & 3],
                "unmasked exceptions": ", ".join(unmasked) or "none",
                "x87 precision": ("24-bit (single)", "reserved", "53-bit (double)", "64-bit (extended)")[x87 >> 8 & 3],
                "x87 rounding": ("to nearest", "down", "up", "toward zero")[x87 >> 10 & 3],
                "x87 unmasked exceptions": ", ".join(x87_unmasked) or "none"}
    fpcr = control[0]
    traps = [n for bit, n in ((8, "invalid"), (9, "divide-by-zero"), (10, "overflow"), (11, "underflow"), (12, "inexact"),
                              (15, "denormal")) if fpcr >> bit & 1]
    return {"flush-to-zero": on(fpcr, 24), "half-precision flush-to-zero": on(fpcr, 19), "default NaN": on(fpcr, 25),
            "alternative half precision": on(fpcr, 26),
            "rounding": ("to nearest", "up", "down", "toward zero")[fpcr >> 22 & 3],
            "trapped exceptions": ", ".join(traps) or "none"}


def describe_control(control: tuple[int, ...], arch: str = ARCH) -> str:
    """One line: the registers in hex and the fields that differ from a fresh process's."""
    default = _fields(arch, DEFAULT_CONTROL[arch])
    odd = [f"{k} {v}" for k, v in _fields(arch, control).items() if default[k] != v]
    regs = f"MXCSR {control[1]:#06x}, x87 control {control[0]:#06x}" if arch == "x86_64" else f"FPCR {control[0]:#x}"
    return f"{regs} ({'; '.join(odd) or 'default: no flush-to-zero, rounding to nearest, exceptions masked'})"


def _control(arch: str, raw: bytes) -> tuple[int, ...]:
    if arch == "x86_64":  # user_fpregs_struct: cwd u16 @0, ..., mxcsr u32 @24
        return (int.from_bytes(raw[0:2], "little") & _X87_CONTROL, int.from_bytes(raw[24:28], "little") & _MXCSR_CONTROL)
    return (int.from_bytes(raw[516:520], "little"),)  # user_fpsimd_state: vregs[32] (512 bytes), fpsr u32, fpcr u32


# -- readings ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ThreadFp:
    """One thread at one reading. ``control``: see :func:`describe_control` (None: not read, ``note`` says why);
    ``affinity``: CPUs it may run on; ``nice`` and ``policy`` (a ``SCHED_*`` name); None where unreadable."""

    tid: int
    name: str
    control: tuple[int, ...] | None
    affinity: frozenset[int] | None = None
    nice: int | None = None
    policy: str | None = None
    note: str = ""


@dataclass(frozen=True)
class FpControl:
    """One reading of process ``pid``: ``threads`` by tid. ``error``: nothing could be read (not permitted,
    no such process, unsupported architecture), with the reason; ``notes``: partial trouble (threads that
    kept appearing); ``exited``: threads that exited during the reading; ``elapsed_s``: how long it took."""

    pid: int
    arch: str
    threads: Mapping[int, ThreadFp] = field(default_factory=dict)
    error: str | None = None
    notes: tuple[str, ...] = ()
    exited: int = 0
    elapsed_s: float = 0.0

    @property
    def observed(self) -> bool:
        """True when every listed thread's control state was read."""
        return self.error is None and all(t.control is not None for t in self.threads.values())

    @property
    def tids(self) -> tuple[int, ...]:
        return tuple(sorted(self.threads))

    def process_control(self) -> tuple[int, ...] | None:
        """The control state new threads are expected to start with: the main thread's, else the most common."""
        main = self.threads.get(self.pid)
        if main is not None and main.control is not None:
            return main.control
        values = [t.control for t in self.threads.values() if t.control is not None]
        return max(set(values), key=values.count) if values else None

    def describe(self) -> str:
        """A few lines for a report: one per distinct state, with the threads in it."""
        if self.error is not None:
            return f"pid {self.pid}: not observed: {self.error}"
        groups: dict[str, list[str]] = {}
        for t in sorted(self.threads.values(), key=lambda t: t.tid):
            key = describe_control(t.control, self.arch) if t.control is not None else f"not read ({t.note})"
            groups.setdefault(key, []).append(f"{t.tid} {t.name!r}")
        lines = [f"pid {self.pid}: {len(self.threads)} thread(s) read in {self.elapsed_s * 1e3:.2f} ms"]
        lines += [f"  {state}: {', '.join(names)}" for state, names in groups.items()]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def _sched(tid: int) -> tuple[frozenset[int] | None, int | None, str | None]:
    try:
        affinity = frozenset(os.sched_getaffinity(tid))
        nice = os.getpriority(os.PRIO_PROCESS, tid)
        policy = os.sched_getscheduler(tid) & 0xFF  # without SCHED_RESET_ON_FORK
    except OSError:
        return None, None, None
    return affinity, nice, _POLICIES.get(policy, str(policy))


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _status_field(text: str, name: str) -> str:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return ""


def _gone(pid: int, tid: int) -> bool:
    """True when thread ``tid`` no longer runs (absent, a zombie, or dead)."""
    stat = _read(f"/proc/{pid}/task/{tid}/stat")
    return not stat or stat[stat.rfind(")") + 2:stat.rfind(")") + 3] in ("Z", "X")


def why_not_permitted(pid: int, tid: int) -> str:
    """Why ``PTRACE_SEIZE`` of ``tid`` (a thread of ``pid``) failed with EPERM: the facts found, most likely first."""
    if os.getpid() == pid:
        return "a process cannot trace its own threads (observe the worker from the referee's process)"
    facts = []
    tracer = _status_field(_read(f"/proc/{pid}/task/{tid}/status"), "TracerPid")
    if tracer not in ("", "0"):
        facts.append(f"thread {tid} is already traced by pid {tracer} (a debugger, or another observer)")
    own = _read("/proc/self/status")
    if _status_field(own, "Seccomp") not in ("", "0"):
        facts.append("this process runs under a seccomp filter (a container's or sandbox's) that may deny ptrace")
    if not int(_status_field(own, "CapEff") or "0", 16) >> 19 & 1:  # CAP_SYS_PTRACE
        me, uids = os.geteuid(), (_status_field(_read(f"/proc/{pid}/status"), "Uid").split() or ["?"])
        try:  # /proc/PID/stat belongs to the root of the target's user namespace once it is not dumpable
            dumpable = uids[0] == "?" or os.stat(f"/proc/{pid}/stat").st_uid == int(uids[0])
        except OSError:
            dumpable = True
        if uids[0] not in ("?", str(me)):
            facts.append(f"the target runs as uid {uids[0]}, this process as uid {me}, without CAP_SYS_PTRACE")
        elif not dumpable:
            facts.append("the target is not dumpable (PR_SET_DUMPABLE 0, as every worker is) and runs outside a user "
                         "namespace this user owns (sandbox mode none?), so tracing it needs CAP_SYS_PTRACE, which this "
                         "process lacks")
        else:
            facts.append("this process lacks CAP_SYS_PTRACE")
    scope = _read("/proc/sys/kernel/yama/ptrace_scope").strip()
    if scope in ("1", "2", "3"):
        facts.append({"1": "Yama ptrace_scope=1: only descendants, or holders of CAP_SYS_PTRACE, may be traced",
                      "2": "Yama ptrace_scope=2: only holders of CAP_SYS_PTRACE may trace",
                      "3": "Yama ptrace_scope=3: ptrace attach is disabled on this machine"}[scope])
    facts.append("else a Linux security module (AppArmor, SELinux) denies it")
    return "ptrace not permitted (EPERM): " + "; ".join(facts)


class _Reading:
    """The state of one :func:`observe` while its tracer thread runs."""

    def __init__(self, pid: int, deadline: float):
        self.pid, self.deadline = pid, deadline
        self.pending: set[int] = set()  # seized and interrupted, not stopped yet
        self.stopped: dict[int, int] = {}  # tid -> signal to deliver on detach
        self.values: dict[int, tuple[int, ...] | None] = {}
        self.seen: set[int] = set()
        self.exited = 0
        self.error: str | None = None
        self.notes: list[str] = []
        self.buf = ctypes.create_string_buffer(_FPREGS_BYTES[ARCH])
        self.iov = _IoVec(ctypes.cast(self.buf, ctypes.c_void_p), len(self.buf))

    def run(self) -> None:
        """Stop every thread, read each, detach; leaves tracees it could not stop to the thread's exit."""
        try:
            self._stop_all()
            for tid in self.stopped:
                self.values[tid] = self._regs(tid)
        finally:
            for tid, sig in self.stopped.items():
                _ptrace(_PTRACE_DETACH, tid, None, sig)

    def _stop_all(self) -> None:
        while True:
            new = [t for t in _tasks(self.pid) if t not in self.seen]
            if not new:
                if not self.seen:
                    self.error = f"no process {self.pid}"
                return
            for tid in new:
                self.seen.add(tid)
                self._seize(tid)
            if self.error is not None:
                return
            self._wait()
            if self.pending:  # the deadline passed
                self.notes.append(f"{len(self.pending)} thread(s) did not stop within the time limit (frozen, or in an "
                                  "uninterruptible sleep); they were not read")
                return

    def _seize(self, tid: int) -> None:
        err = _ptrace(_PTRACE_SEIZE, tid, None, None)
        if err == 0:
            err = _ptrace(_PTRACE_INTERRUPT, tid, None, None)
            if err == 0:
                self.pending.add(tid)
                return
        if err == 1 and not _gone(self.pid, tid):  # EPERM; a zombie's refusal says nothing about permission
            self.error = why_not_permitted(self.pid, tid)
        elif err not in (0, 1, 3):  # ESRCH (3): it exited
            self.error = f"ptrace(PTRACE_SEIZE) of thread {tid} failed: {os.strerror(err)}"
        else:
            self.exited += 1
            self.seen.discard(tid)

    def _wait(self) -> None:
        spins = 0
        while self.pending and time.monotonic() < self.deadline:
            for tid in list(self.pending):
                try:
                    got, status = os.waitpid(tid, os.WNOHANG | _WALL)
                except ChildProcessError:  # reaped or gone
                    got, status = tid, 0
                if not got:
                    continue
                self.pending.discard(tid)
                if os.WIFSTOPPED(status):
                    # PTRACE_EVENT_STOP: our interrupt, or a group stop; else a signal-delivery stop: deliver it on detach
                    event_stop = status >> 16 == _PTRACE_EVENT_STOP
                    self.stopped[tid] = 0 if event_stop else os.WSTOPSIG(status)
                else:
                    self.exited += 1
                    self.seen.discard(tid)
            if self.pending:
                spins += 1
                if spins < 50:
                    os.sched_yield()
                else:
                    time.sleep(1e-4)

    def _regs(self, tid: int) -> tuple[int, ...] | None:
        self.iov.iov_len = len(self.buf)
        err = _ptrace(_PTRACE_GETREGSET, tid, _NT_PRFPREG, ctypes.addressof(self.iov))
        if err:
            self.notes.append(f"thread {tid}: PTRACE_GETREGSET failed: {os.strerror(err)}")
            return None
        return _control(ARCH, self.buf.raw)


def observe(pid: int, *, timeout_s: float = 0.25) -> FpControl:
    """Read every thread of process ``pid`` from outside (see the module docstring); never raises for
    the observed process's behaviour. Takes at most about ``timeout_s`` (plus reading /proc)."""
    start = time.perf_counter()
    if ARCH not in _FPREGS_BYTES:
        return FpControl(pid, ARCH, error=f"reading floating-point control registers is not implemented for {ARCH}")
    reading = _Reading(pid, time.monotonic() + timeout_s)
    tracer = threading.Thread(target=reading.run, name="kernelslot-fpcontrol", daemon=True)
    tracer.start()
    tracer.join(timeout_s + 1.0)  # run() itself is bounded by the deadline; tracees it holds are freed when it exits
    if tracer.is_alive():
        return FpControl(pid, ARCH, error="the observer thread did not finish in time", elapsed_s=time.perf_counter() - start)
    if reading.error is not None:
        return FpControl(pid, ARCH, error=reading.error, elapsed_s=time.perf_counter() - start)
    threads = {}
    for tid in sorted(reading.seen):
        name = _read(f"/proc/{pid}/task/{tid}/comm").strip() or "?"
        control = reading.values.get(tid)
        note = "" if control is not None else ("did not stop in time" if tid not in reading.stopped else "registers unreadable")
        threads[tid] = ThreadFp(tid, name, control, *_sched(tid), note=note)
    return FpControl(pid, ARCH, threads, None, tuple(reading.notes), reading.exited, time.perf_counter() - start)


# -- comparing ---------------------------------------------------------------------------------
def _changes(arch: str, was: tuple[int, ...], now: tuple[int, ...]) -> str:
    a, b = _fields(arch, was), _fields(arch, now)
    return ", ".join(f"{k} {a[k]} -> {b[k]}" for k in a if a[k] != b[k])


def _cpus(cpus: frozenset[int]) -> str:
    """``{0, 1, 2, 5}`` as ``0-2,5``."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or "none"


def _sched_changes(was: ThreadFp, now: ThreadFp) -> list[str]:
    out = []
    if None not in (was.affinity, now.affinity) and was.affinity != now.affinity:
        out.append(f"CPU affinity {_cpus(was.affinity)} -> {_cpus(now.affinity)}")
    if None not in (was.nice, now.nice) and was.nice != now.nice:
        out.append(f"nice {was.nice} -> {now.nice}")
    if None not in (was.policy, now.policy) and was.policy != now.policy:
        out.append(f"scheduling policy {was.policy} -> {now.policy}")
    return out


def diff(before: FpControl, after: FpControl) -> list[str]:
    """What changed from ``before`` to ``after`` (two readings of one process), one line each, e.g.
    ``"thread 41 'python3': MXCSR 0x1f80 -> 0x9fc0 (flush-to-zero off -> on, denormals-are-zero off -> on)"``.

    A thread in both readings is compared with itself; a thread that started in between is compared
    with ``before``'s process state (:meth:`FpControl.process_control`; its main thread's scheduling)
    — a new thread inherits its creator's registers, so a difference means someone changed them.
    Threads that exited are not a change; values not read on either side are not compared (check
    :attr:`FpControl.observed` for that). Empty when either reading failed as a whole.
    """
    if before.error is not None or after.error is not None:
        return []
    arch, out = after.arch, []
    base = before.process_control()
    main = before.threads.get(before.pid)
    for tid, now in sorted(after.threads.items()):
        was = before.threads.get(tid)
        label = f"thread {tid} {now.name!r}"
        was_control = was.control if was is not None else base
        if was is None:
            label += " (started since the first reading)"
        if now.control is not None and was_control is not None and now.control != was_control:
            regs = ", ".join(f"{reg} {a:#06x} -> {b:#06x}" for reg, a, b in zip(_REGISTERS[arch], was_control, now.control)
                             if a != b)
            out.append(f"{label}: {regs} ({_changes(arch, was_control, now.control)})")
        ref = was if was is not None else main
        if ref is not None:
            out.extend(f"{label}: {c}" for c in _sched_changes(ref, now))
    return out
