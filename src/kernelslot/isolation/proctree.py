"""What the referee sees of a worker's processes from outside, through the host's ``/proc``.

Nothing here asks the worker: a candidate cannot forge it. A process tree is read from
``/proc/PID/task/TID/children``; pids are the referee's (host) pids, and ``ns_pid`` is the pid
the process has in its own PID namespace (the last field of ``NSpid``), which is what a
sandboxed process reports about itself.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

__all__ = ["Process", "read", "tree", "children", "descendants", "ns_pid", "resident_bytes", "thread_cpu_ns", "stop", "resume",
           "pinned", "timed_cpu"]



@dataclass(frozen=True)
class Process:
    pid: int  # host pid
    ppid: int  # host pid of the parent (0 for the root of the walk)
    ns_pid: int
    state: str  # one letter, as in /proc/PID/stat (Z: zombie)
    name: str  # comm

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


def read(path: str) -> str | None:
    """The text of ``path``, or None when it cannot be read (a vanished process, a missing file)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (of every one of its threads)."""
    kids: list[int] = []
    for tid in _tasks(pid):
        text = read(f"/proc/{pid}/task/{tid}/children")
        if text:
            kids.extend(int(c) for c in text.split())
    return kids


def ns_pid(pid: int) -> int | None:
    """The pid ``pid`` has inside its own PID namespace (None when it is gone)."""
    status = read(f"/proc/{pid}/status")
    if status is None:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def _process(pid: int, ppid: int, with_ns: bool) -> Process | None:
    stat = read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    name = stat[stat.find("(") + 1:stat.rfind(")")]
    state = stat[stat.rfind(")") + 2:stat.rfind(")") + 3]
    inner = ns_pid(pid) if with_ns else pid
    return None if inner is None else Process(pid, ppid, inner, state, name)


def descendants(roots: list[int], skip: set[int] = frozenset(), with_ns: bool = False) -> list[Process]:
    """The processes below ``roots`` (not the roots), not descending into ``skip``; pre-order."""
    out: list[Process] = []
    stack = [(c, r) for r in reversed(roots) for c in reversed(children(r)) if c not in skip]
    seen: set[int] = set(roots)
    while stack:
        pid, ppid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        proc = _process(pid, ppid, with_ns)
        if proc is None:
            continue
        out.append(proc)
        stack.extend((c, pid) for c in reversed(children(pid)) if c not in skip)
    return out


def tree(root: int, with_ns: bool = True) -> list[Process]:
    """``root`` and all its descendants (pre-order); processes that vanish meanwhile are left out."""
    top = _process(root, 0, with_ns)
    return ([top] if top else []) + descendants([root], with_ns=with_ns)


def resident_bytes(pids: list[int], shared_allowance: int = 0) -> int:
    """Private resident memory of ``pids``: anonymous pages plus shared-memory pages beyond
    ``shared_allowance`` (the bytes of the referee's tensors these processes map, which are the
    referee's memory, not theirs)."""
    anon = shmem = 0
    for pid in pids:
        text = read(f"/proc/{pid}/status")
        if text is None:
            continue
        for line in text.splitlines():
            if line.startswith("RssAnon:"):
                anon += int(line.split()[1]) * 1024
            elif line.startswith("RssShmem:"):
                shmem += int(line.split()[1]) * 1024
    return anon + max(0, shmem - shared_allowance)


def thread_cpu_ns(pid: int) -> dict[int, tuple[int, str]]:
    """Per thread of ``pid``: CPU time used so far (ns) and its name."""
    out: dict[int, tuple[int, str]] = {}
    for tid in _tasks(pid):
        sched = read(f"/proc/{pid}/task/{tid}/schedstat")
        if sched:
            ns = int(sched.split()[0])
        else:  # no schedstat: clock ticks from stat
            stat = read(f"/proc/{pid}/task/{tid}/stat")
            if stat is None:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            ns = (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        comm = (read(f"/proc/{pid}/task/{tid}/comm") or "?").strip()
        out[int(tid)] = (ns, comm)
    return out


def stop(pids: list[int], timeout_s: float = 1.0) -> list[int]:
    """SIGSTOP each of ``pids`` and wait until every thread of each is stopped; the pids signalled.

    Waiting matters: a stop is delivered asynchronously, and a thread still running would compete
    for the CPU with whatever is timed next. Gone processes are skipped.
    """
    import signal
    import time

    sent = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout_s
    for pid in sent:
        while time.monotonic() < deadline:
            states = [read(f"/proc/{pid}/task/{t}/stat") for t in _tasks(pid)]
            if all(s is None or s.rsplit(")", 1)[-1].split()[0] in "tTXZ" for s in states):
                break
            time.sleep(0.0002)
    return sent


def resume(pids: list[int]) -> None:
    """SIGCONT each of ``pids`` (gone ones are skipped)."""
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass


def timed_cpu() -> int:
    """The CPU a timed step's calling thread runs on, for every runner alike: the highest this
    process may use (``taskset`` on the referee chooses among them)."""
    return max(os.sched_getaffinity(0))


@contextlib.contextmanager
def pinned(pid: int, cpu: int) -> Iterator[None]:
    """Process ``pid``'s main thread on ``cpu`` alone while the block runs; afterwards it gets its mask
    back, and so does every thread of the process made meanwhile that inherited ``{cpu}`` (a
    thread pool first used inside the block would otherwise stay on one CPU).

    Which of the machine's CPUs a timed call lands on is the largest noise in a timed pair on a
    2-vCPU VM: the same kernel read x0.83-x1.10 against itself with both sides free, x0.975-x1.007
    with every process on one CPU (docs/referee.md, "Timing"). Other threads of the process keep
    their masks, so a multi-threaded kernel still has every CPU."""
    try:
        mask = os.sched_getaffinity(pid)
        before = set(_tasks(pid))
        os.sched_setaffinity(pid, {cpu})
    except OSError:  # gone, or not ours to pin: the block runs unpinned
        yield
        return
    try:
        yield
    finally:
        for tid in [pid] + [int(t) for t in _tasks(pid) if t not in before]:
            try:
                if tid == pid or os.sched_getaffinity(tid) == {cpu}:
                    os.sched_setaffinity(tid, mask)
            except OSError:
                pass
