"""The referee's handle on worker processes (used by :class:`~kernelslot.isolation.worker.WorkerRunner`).

* :class:`Zygote`: one per runner, started inside that runner's own sandbox
  (:mod:`kernelslot.isolation.sandbox`) with its own scratch directory, so the candidate's and
  the incumbent's workers share no PID namespace, no files and no processes.
* :class:`WorkerProcess`: one worker forked by the zygote.
* :class:`Watch`: what the referee checks from outside, through the host's ``/proc``
  (:mod:`kernelslot.isolation.proctree`, nothing the candidate can forge): while a request runs,
  the number of processes (``Limits.max_processes``) and, for a worker without a cgroup,
  resident memory (``Limits.memory_bytes``); after it, processes the candidate left running
  (``process_left_running``) and threads still using CPU (``thread_left_running``).

Resident memory is capped by the kernel where the host lets the referee make cgroups
(:mod:`kernelslot.isolation.cgroup`: each worker in a group of its own, ``memory.max`` and
``pids.max``, set before it runs candidate code); elsewhere it is polled every ``POLL_S``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Sequence

from kernelslot.isolation import cgroup, proctree
from kernelslot.isolation.runner import RunnerError
from kernelslot.isolation.sandbox import Sandbox
from kernelslot.isolation.child import bootstrap

__all__ = ["Contained", "Limits", "Zygote", "WorkerProcess", "Watch"]

_clock = time.perf_counter
POLL_S = 0.02  # how often resident memory and the process count are read while a request runs
BUSY_CONFIRM_S = 0.1  # a thread seen using CPU after return is watched this long more
BUSY_FRACTION = 0.15  # ... and is busy if it used more than this fraction of that time


class Contained(Exception):
    """A failure of candidate code the referee contained; ``cause`` names it (see isolation/worker.py)."""

    def __init__(self, cause: str, message: str, elapsed_s: float = 0.0):
        super().__init__(message)
        self.cause, self.message, self.elapsed_s = cause, message, elapsed_s


@dataclasses.dataclass(frozen=True)
class Limits:
    memory_bytes: int = 4 << 30  # resident memory of a worker and its processes; 0: no cap
    max_processes: int = 64  # processes of a worker (itself included)
    max_tasks: int = 4096  # threads and processes together: cgroup pids.max, a hard stop between two polls
    cpu_s: int = 3600  # RLIMIT_CPU per process
    file_bytes: int = 4 << 30  # RLIMIT_FSIZE

    def for_worker(self) -> dict:
        return {"cpu_s": self.cpu_s, "file_bytes": self.file_bytes}


class Zygote:
    """The clean interpreter that forks one runner's workers, inside that runner's sandbox."""

    def __init__(self, box: Sandbox, scratch: str, log_path: str, start_timeout_s: float, visible: Sequence[str] = ()):
        self.box, self.scratch, self.visible = box, scratch, frozenset(visible)
        cgroup.hierarchy()  # found before the sandbox starts: a delegated v2 group must hold no other process of ours
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log_path, "ab") as log:
            # the interpreter by its real path (a venv's path may name the project); sys.path comes with the bootstrap
            self.process = box.popen([os.path.realpath(sys.executable), "-"], scratch_dir=scratch, pass_fds=(theirs.fileno(),),
                                     stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, visible=sorted(visible))
        try:
            self.process.stdin.write(bootstrap(theirs.fileno(), box.mode, scratch, sorted(visible)).encode())
            self.process.stdin.close()
        except OSError:
            pass  # it died at once: reported below
        theirs.close()
        self.sock = ours
        self.sock.settimeout(start_timeout_s)
        try:
            ready = json.loads(self.sock.recv(1 << 16) or b"{}")
        except (socket.timeout, OSError, ValueError):
            ready = {}
        if "ready" not in ready:
            self.close()
            raise RunnerError(f"the worker zygote did not start within {start_timeout_s:g}s in sandbox {box.mode} "
                              f"(exit code {self.process.poll()}; its log: {log_path})")
        self.pid = self.host_pid(int(ready["ready"]))

    def host_pid(self, ns_pid: int) -> int:
        """The referee's pid of the sandbox process that calls itself ``ns_pid``."""
        for p in proctree.tree(self.process.pid):
            if p.ns_pid == ns_pid and p.alive:
                return p.pid
        raise RunnerError(f"the worker zygote reported pid {ns_pid}, which is not in its sandbox")

    def request(self, req: dict, timeout: float, fds: Sequence[int] = ()) -> dict:
        socket.send_fds(self.sock, [json.dumps(req).encode()], list(fds))
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except (socket.timeout, OSError) as exc:
            raise RunnerError(f"the worker zygote did not answer {req['op']} within {timeout:g}s ({exc})") from None
        if not data:
            raise RunnerError(f"the worker zygote exited (code {self.process.poll()})")
        return json.loads(data)

    def alive(self) -> bool:
        return self.process.poll() is None

    def strays(self, workers: set[int]) -> list[proctree.Process]:
        """Live processes below the zygote that are not ``workers``: what candidates started and left.

        The zygote is a child subreaper (or the PID namespace's init), so an orphan of a worker's
        child lands here; a worker's own children are below the worker. Cheap: a few ``/proc`` reads.
        """
        return [p for p in proctree.descendants([self.pid, *workers], skip=workers) if p.alive]

    def close(self) -> None:
        """Tear the whole sandbox down (every process in it dies with its launcher)."""
        self.sock.close()
        for p in reversed(proctree.tree(self.process.pid)):
            _kill(p.pid)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class WorkerProcess:
    """One worker process (forked by the zygote) and its socket."""

    def __init__(self, zygote: Zygote, generation: int, limits: Limits, log_dir: str, start_timeout_s: float):
        self.zygote, self.generation = zygote, generation
        self.source: str | None = None  # the kernel file/module this worker is bound to
        self.registered: set[int] = set()
        self.prepared: set[int] = set()
        self.loaded: set[object] = set()  # KernelSources imported in this worker
        self.shared_bytes = 0  # bytes of the referee's storages this worker maps
        self.fp: object | None = None  # the last outside reading of its threads' FP control (isolation/fpcontrol.py)
        self.log_path = os.path.join(log_dir, f"worker-{generation}.log")
        self.exitcode: int | None = None
        parent, child = socket.socketpair()
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            ns_pid = int(zygote.request({"op": "fork", "limits": limits.for_worker()}, start_timeout_s,
                                        [child.fileno(), log])["pid"])
        finally:
            child.close()
            os.close(log)
        self.ns_pid = ns_pid
        self.pid = zygote.host_pid(ns_pid)
        self.memory_bytes = limits.memory_bytes
        self.cap = _cap(self.pid, limits)  # before the first request: no candidate code has run in it yet
        self.fd_sock = socket.socket(fileno=os.dup(parent.fileno()))  # storage descriptors go here
        self.conn = Connection(parent.detach())

    def log_tail(self, lines: int = 12) -> str:
        try:
            with open(self.log_path, "rb") as f:
                text = f.read()[-8192:].decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def kill(self) -> None:
        if self.exitcode is None:
            for p in reversed(proctree.tree(self.pid)):  # children that left its session too
                _kill(p.pid)
            try:
                self.exitcode = self.zygote.request({"op": "wait", "pid": self.ns_pid, "timeout": 10.0}, 20.0)["code"]
            except (RunnerError, OSError):
                pass
        if self.cap is not None:
            self.cap.close()
        self.conn.close()
        self.fd_sock.close()

    def exit_reason(self) -> tuple[str, str]:
        if self.exitcode is None:
            try:
                self.exitcode = self.zygote.request({"op": "wait", "pid": self.ns_pid, "timeout": 5.0}, 15.0)["code"]
            except (RunnerError, OSError):
                return "crash", "the worker's sandbox went away in the middle of the call (killed from inside?)"
        rc = self.exitcode
        if rc is None:
            self.kill()
            return "protocol", "the worker closed its socket but did not exit; it was killed"
        if rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
            if -rc == signal.SIGKILL and self.cap is not None and self.cap.oom_kills():
                return "out_of_memory", (f"resident memory reached the limit of {self.memory_bytes / (1 << 30):.2f} GiB "
                                         f"(--memory-limit, enforced by {self.cap.h.mechanism}); the kernel killed the worker")
            if -rc == signal.SIGKILL:
                return "crash", f"the worker was killed by {name} (out of memory? the kernel's OOM killer sends SIGKILL)"
            if -rc == signal.SIGXCPU:
                return "crash", f"the worker was killed by {name}: it used its CPU-time limit"
            return "crash", f"the worker was killed by signal {name}"
        return "exit", f"the worker exited with code {rc} in the middle of the call (os._exit/sys.exit in candidate code?)"


_cap_failed = False


def _cap(pid: int, limits: Limits) -> cgroup.Cap | None:
    """A cgroup for worker ``pid`` with the limits, or None (then its memory is polled; said once)."""
    global _cap_failed
    h = cgroup.hierarchy() if limits.memory_bytes else None
    if h is None or _cap_failed:
        return None
    cap = None
    try:
        cap = cgroup.Cap(h, limits.memory_bytes, limits.max_tasks)
        cap.add(pid)
        return cap
    except OSError as exc:
        if cap is not None:
            cap.close()
        _cap_failed = True
        print(f"kernelslot: warning: cannot put a worker in a cgroup ({exc}); its memory is polled instead", file=sys.stderr)
        return None


class Watch:
    """The referee's outside view of one runner's sandbox."""

    def __init__(self, limits: Limits):
        self.limits = limits

    def wait(self, proc: WorkerProcess, others: set[int], timeout: float, start: float) -> bool:
        """Wait for ``proc``'s reply, enforcing the resource limits; False on timeout."""
        deadline = start + timeout
        while True:
            remaining = deadline - _clock()
            if remaining <= 0:
                return False
            if proc.conn.poll(min(POLL_S, remaining)):
                return True
            mine = [proc.pid] + [p.pid for p in proc.zygote.strays({proc.pid, *others})]
            if len(mine) > self.limits.max_processes:
                raise Contained("process_limit", f"the worker started more than {self.limits.max_processes} processes "
                                                 f"({len(mine)}); the worker and its sandbox were killed", _clock() - start)
            if self.limits.memory_bytes and proc.cap is None:  # with a cgroup the kernel enforces it
                used = proctree.resident_bytes(mine, proc.shared_bytes)
                if used > self.limits.memory_bytes:
                    raise Contained("out_of_memory", f"resident memory {used / (1 << 30):.2f} GiB exceeded the limit of "
                                                     f"{self.limits.memory_bytes / (1 << 30):.2f} GiB (--memory-limit); "
                                                     "the worker was killed", _clock() - start)

    @staticmethod
    def busy_threads(proc: WorkerProcess, window_s: float) -> str | None:
        """After ``window_s`` of watching: a thread of ``proc`` that keeps using CPU, described; else None.

        The first half of the window is a grace period in which a thread pool may spin down (libgomp
        spins a few ms after a parallel region, then sleeps): a thread is a suspect only if it used
        CPU in the second half. A suspect is watched :data:`BUSY_CONFIRM_S` more and is busy if it
        used more than :data:`BUSY_FRACTION` of that time. A thread that keeps computing is a
        suspect exactly as with a whole-window test, so the grace costs no detection; it spares an
        honest pool the confirmation (~0.1 s per checked call).
        """
        time.sleep(window_s / 2)
        first = proctree.thread_cpu_ns(proc.pid)
        time.sleep(window_s / 2)
        second = proctree.thread_cpu_ns(proc.pid)
        half_ns = window_s / 2 * 1e9
        suspects = [t for t in second if second[t][0] - first.get(t, (0,))[0] > max(2.5e5, 0.05 * half_ns)]  # new threads too
        if not suspects:
            return None
        time.sleep(BUSY_CONFIRM_S)
        third = proctree.thread_cpu_ns(proc.pid)
        busy = [(t, third[t][1], (third[t][0] - second[t][0]) / 1e6) for t in suspects
                if t in third and third[t][0] - second[t][0] > BUSY_FRACTION * BUSY_CONFIRM_S * 1e9]
        if not busy:
            return None
        tid, name, ms = busy[0]
        return (f"{len(busy)} thread(s) kept using CPU after entry returned ({name!r}: {ms:.0f} ms of CPU in the next "
                f"{BUSY_CONFIRM_S * 1e3:.0f} ms); all work must finish before entry returns (an idle thread pool is fine)")
