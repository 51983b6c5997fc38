"""Kernel-enforced caps on a worker's resident memory and tasks, through cgroups, where the host lets us.

:func:`hierarchy` finds, once per process, a cgroup directory the referee may create groups in:

* **cgroup v2**: ``$KERNELSLOT_CGROUP`` (a directory delegated to this user, e.g. by
  ``systemd-run --user --scope -p Delegate=yes``), else this process's own cgroup when it is
  writable by us. Its ``cgroup.subtree_control`` must enable ``memory`` (and ``pids``); where
  this process sits in that directory itself, it first moves into a leaf of it (the "no
  internal processes" rule), and gives up (moving back) when other processes are there too.
* **cgroup v1**: this process's own group in the ``memory`` hierarchy (and in ``pids``), when
  writable by us.

Else ``None``, and the referee polls resident memory instead (isolation/process.py).
A :class:`Cap` is one group per worker: ``memory.max`` (v1: ``memory.limit_in_bytes`` and
``memory.memsw.limit_in_bytes``, so swap is no way out), ``pids.max`` (threads count too), the
worker moved in before it runs any candidate code (its children inherit the group); the kernel
reclaims, then OOM-kills inside the group. Pages are charged to whoever first touches them, so
the referee's shared tensors stay the referee's and an untouched reservation costs nothing.
Group names are neutral (random hex): a candidate can read its own ``/proc/self/cgroup``.
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import os
import secrets
import signal
import time

from kernelslot.isolation.proctree import read as _read

__all__ = ["Hierarchy", "Cap", "hierarchy", "why_not", "describe"]


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    memory_dir: str  # per-worker groups are made here (v2: memory and pids together)
    pids_dir: str | None = None  # v1: the pids hierarchy's directory (None: no task cap)
    note: str = ""  # why not the other version / what is missing

    @property
    def mechanism(self) -> str:
        files = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        return f"cgroup v{self.version} {files}" + (" + pids.max" if self.pids_dir else "")

    def describe(self) -> str:
        return f"{self.mechanism} per worker (under {self.memory_dir})"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the fs, fs type, super options) of every cgroup mount."""
    out = []
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            out.append((fields[4], fields[3], tail[0], set(tail[2].split(","))))
    return out


def _own(controller: str | None) -> str | None:
    """This process's cgroup path in the v2 hierarchy (``controller`` None) or in a v1 controller's."""
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        ident, ctrls, path = line.split(":", 2)
        if (controller is None and ident == "0" and ctrls == "") or (controller and controller in ctrls.split(",")):
            return path
    return None


def _dir(mount: str, root: str, path: str) -> str | None:
    if root != "/" and not (path + "/").startswith(root.rstrip("/") + "/"):
        return None
    rel = path[len(root):] if root != "/" else path
    return os.path.join(mount, rel.lstrip("/"))


def _writable(d: str) -> bool:
    return os.path.isdir(d) and os.access(d, os.W_OK) and os.access(os.path.join(d, "cgroup.procs"), os.W_OK)


def _enable(d: str, controllers: list[str]) -> list[str]:
    """Enable ``controllers`` for ``d``'s children; those now enabled."""
    have = set((_read(os.path.join(d, "cgroup.controllers")) or "").split())
    for c in controllers:
        if c in have and c not in (_read(os.path.join(d, "cgroup.subtree_control")) or "").split():
            _write(os.path.join(d, "cgroup.subtree_control"), f"+{c}")
    return [c for c in controllers if c in (_read(os.path.join(d, "cgroup.subtree_control")) or "").split()]


def _v2(mount: str, root: str) -> Hierarchy | str:
    wanted = os.environ.get("KERNELSLOT_CGROUP")
    own = _own(None)
    d = wanted or (_dir(mount, root, own) if own is not None else None)
    if d is None:
        return "cgroup v2: this process's group is outside the mounted hierarchy"
    if "memory" not in (_read(os.path.join(d, "cgroup.controllers")) or "").split():
        return f"cgroup v2: the memory controller is not available in {d}"
    if not _writable(d):
        return f"cgroup v2: {d} is not delegated to this user (set KERNELSLOT_CGROUP to a delegated group)"
    try:
        enabled = _enable(d, ["memory", "pids"])
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            return f"cgroup v2: cannot enable memory in {d} ({exc.strerror})"
        leaf = os.path.join(d, secrets.token_hex(6))  # processes live in leaves only: this one moves into one
        os.mkdir(leaf)
        _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
        try:
            enabled = _enable(d, ["memory", "pids"])
        except OSError as again:
            _write(os.path.join(d, "cgroup.procs"), str(os.getpid()))
            os.rmdir(leaf)
            return f"cgroup v2: cannot enable memory in {d}: other processes share it ({again.strerror})"
    if "memory" not in enabled:
        return f"cgroup v2: memory cannot be enabled for the children of {d}"
    return Hierarchy(2, d, d if "pids" in enabled else None)


def _v1(mounts: list[tuple[str, str, str, set[str]]]) -> Hierarchy | str:
    dirs = {}
    for ctrl in ("memory", "pids"):
        for mount, root, fstype, opts in mounts:
            path = _own(ctrl)
            if fstype == "cgroup" and ctrl in opts and path is not None:
                d = _dir(mount, root, path)
                if d is not None and _writable(d):
                    dirs[ctrl] = d
    if "memory" not in dirs:
        return "cgroup v1: no memory hierarchy with a group writable by this user"
    return Hierarchy(1, dirs["memory"], dirs.get("pids"))


@functools.lru_cache(maxsize=1)
def hierarchy() -> Hierarchy | None:
    """Where worker groups go on this host, or None (then :func:`why_not` says why)."""
    global _why_not
    if os.environ.get("KERNELSLOT_CGROUP") == "none":
        _why_not = "cgroups disabled by KERNELSLOT_CGROUP=none"
        return None
    mounts = _mounts()
    reasons = []
    for mount, root, fstype, _ in mounts:
        if fstype == "cgroup2":
            try:
                got = _v2(mount, root)
            except OSError as exc:
                got = f"cgroup v2: {exc}"
            if isinstance(got, Hierarchy) and _works(got):
                return got
            reasons.append(got if isinstance(got, str) else "cgroup v2: a test group could not be made")
    got = _v1(mounts)
    if isinstance(got, Hierarchy) and _works(got):
        return dataclasses.replace(got, note="; ".join(reasons))
    reasons.append(got if isinstance(got, str) else "cgroup v1: a test group could not be made")
    _why_not = "; ".join(reasons) or "no cgroup file system is mounted"
    return None


_why_not = ""


def why_not() -> str:
    hierarchy()
    return _why_not


def _works(h: Hierarchy) -> bool:
    try:
        Cap(h, 1 << 30, 64).close()
        return True
    except OSError:
        return False


def describe(memory_bytes: int) -> str:
    """One line for receipts: how a worker's resident memory is capped on this host."""
    if not memory_bytes:
        return "no memory cap (--memory-limit 0)"
    limit = f"{memory_bytes / (1 << 30):.2f} GiB"
    h = hierarchy()
    if h is not None:
        return f"{limit} resident, {h.describe()}"
    return f"{limit} resident, polled from /proc every 20 ms ({why_not()})"


class Cap:
    """One worker's group(s): created with the limits; :meth:`add` the worker before candidate code runs."""

    def __init__(self, h: Hierarchy, memory_bytes: int, max_tasks: int):
        self.h = h
        name = secrets.token_hex(6)
        self.memory_dir = os.path.join(h.memory_dir, name)
        self.dirs = [self.memory_dir]
        if h.version == 1 and h.pids_dir:
            self.dirs.append(os.path.join(h.pids_dir, name))
        for d in self.dirs:
            os.mkdir(d)
        try:
            mem = self.memory_dir
            if h.version == 2:
                _write(os.path.join(mem, "memory.max"), str(memory_bytes))
                if os.path.exists(os.path.join(mem, "memory.swap.max")):
                    _write(os.path.join(mem, "memory.swap.max"), "0")
            else:
                _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
                if os.path.exists(os.path.join(mem, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_bytes))
            if h.pids_dir:
                _write(os.path.join(self.dirs[-1], "pids.max"), str(max_tasks))
        except OSError:
            self.close()
            raise

    def add(self, pid: int) -> None:
        for d in self.dirs:
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    def oom_kills(self) -> int:
        """How many processes of the group the kernel's OOM killer killed (v1 without the counter: hits of the limit)."""
        mem = self.memory_dir
        text = _read(os.path.join(mem, "memory.events" if self.h.version == 2 else "memory.oom_control")) or ""
        for line in text.splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return int((_read(os.path.join(mem, "memory.failcnt")) or "0").strip() or 0) if self.h.version == 1 else 0

    def close(self) -> None:
        """Kill what is left in the group(s) and remove them."""
        for _ in range(50):
            left = [int(p) for d in self.dirs for p in (_read(os.path.join(d, "cgroup.procs")) or "").split()]
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for d in list(self.dirs):
                try:
                    os.rmdir(d)
                    self.dirs.remove(d)
                except FileNotFoundError:
                    self.dirs.remove(d)
                except OSError:
                    pass
            if not self.dirs:
                return
            time.sleep(0.01)
