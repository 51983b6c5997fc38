"""The rank processes of a local collective verification, and the deadline-bounded exchanges with them.

A :class:`CollectiveSession` for a group of ``W`` ranks spawns ``W + 1`` processes
(``python -m kernelslot.verify.collective.rank``), each in its own sandbox and session (so a
kill reaches anything the candidate started). All of them join one private network namespace
(:class:`~kernelslot.isolation.netns.GroupNetwork`, loopback only) where the sandbox allows it, and
meet on a ``TCPStore`` that global rank 0 hosts on its ``127.0.0.1`` (its port comes back to
this process, which hands it to the others; gloo on CPU, NCCL on CUDA). The referee talks to
every rank over Unix socket pairs only. Global rank 0 is a *spare*: in the default world
group, outside the candidate's group (``new_group([1..W])``), it never calls a collective, so a
collective on the default group never completes and is caught at the deadline. Group rank ``r``
is process ``r + 1``.

:meth:`CollectiveSession.exchange` sends one frame to every rank and waits, under one per-call
deadline, for each rank's reply (:mod:`kernelslot.isolation.wire`: JSON, never pickle).
It returns the replies and, for ranks that gave none, one failure line each naming the rank and
the cause: its process exited (exit code, signal, output tail), it wrote something that is not a
reply on its channel (``protocol``), or it overran the deadline (where its stack was, as its
watchdog reported; ranks stuck in their own code first). After any of those the session is
``broken`` and must be closed; :meth:`close` kills every rank's process group. A deadline that
passed or a rank process that died also sets ``fatal`` (what happened, in words): the referee then
runs no further profile of that candidate (a hang costs one deadline per candidate, not one per
profile).

What the referee sees of the ranks from outside, through the host's ``/proc`` and ``ptrace`` (nothing a
rank can forge): each group rank's host pid (found from the pid it reported at start-up, before any
candidate code ran, as :class:`~kernelslot.isolation.process.Zygote` finds its workers), its threads
(:meth:`CollectiveSession.threads`), which of them keep using CPU after a call
(:meth:`CollectiveSession.settle`, the worker's settle-window rule) and every thread's
floating-point control state (:meth:`CollectiveSession.numeric_changes`, read with
:func:`kernelslot.isolation.fpcontrol.observe` after each exchange and compared with the reading
before it; the first reading is taken before any candidate code runs).
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import torch

from kernelslot.isolation import fpcontrol, proctree, sandbox
from kernelslot.isolation.netns import GroupNetwork, NetworkUnavailable
from kernelslot.isolation.process import BUSY_CONFIRM_S, BUSY_FRACTION
from kernelslot.isolation.sandbox import neutral_env
from kernelslot.isolation.wire import WireError, recv_frame, send_frame

__all__ = ["CollectiveSession", "SessionError", "stuck_where", "STARTUP_S"]

STARTUP_S = 120.0  # import torch + rendezvous on a loaded machine
STOP_GRACE_S = 1.0  # after one rank raised, how long its peers get to answer before the session is broken
MAX_REPLY_BYTES = 1 << 20


class SessionError(RuntimeError):
    """The rank processes could not be started or joined (the message names the rank)."""


def _tail(path: str, lines: int = 6) -> str:
    try:
        with open(path, errors="replace") as fh:
            text = fh.read().strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def stuck_where(frame_stack: str | None) -> str:
    """A one-line summary of a stack dump: the innermost candidate frame and any torch.distributed call."""
    if not frame_stack:
        return "no stack (the rank never answered)"
    frames = [ln.strip() for ln in frame_stack.splitlines() if ln.strip().startswith("File ")]
    in_dist = [f for f in frames if f"torch{os.sep}distributed" in f]
    own = [f for f in frames if f"kernelslot{os.sep}verify" not in f and "site-packages" not in f and "/lib/python" not in f]
    parts = []
    if own:
        parts.append("in candidate code at " + own[-1].removeprefix("File "))
    if in_dist:
        func = in_dist[-1].rsplit(" in ", 1)[-1]
        parts.append(f"waiting inside torch.distributed ({func})")
    return "; ".join(parts) or "stack: " + (frames[-1] if frames else "unknown")


def _group_network() -> GroupNetwork:
    try:
        return GroupNetwork()
    except NetworkUnavailable as exc:
        raise SessionError(f"cannot make the process group's private network namespace: {exc}") from None


class CollectiveSession:
    """One spare rank (global rank 0) plus ``group_size`` candidate ranks (global 1..W). Always :meth:`close` it."""

    def __init__(self, group_size: int, device: str = "cpu", timeout_s: float = 30.0):
        self.group_size, self.device, self.timeout_s = group_size, device, timeout_s
        self.world = group_size + 1
        self.backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        self.broken = False
        self.fatal = ""  # a deadline passed or a rank died: no further profile of this candidate runs (the cause)
        self.pids: list[int] = []  # host pid of group rank r at r (found at start-up)
        self.unobserved = ""  # why the ranks' floating-point control state cannot be read from outside ('' when it can)
        self._fp: list[fpcontrol.FpControl] = []  # the last outside reading of each group rank
        self.procs: list[subprocess.Popen] = []
        self.socks: list[socket.socket] = []
        self.logs: list[str] = []
        self._next_key = 0
        self._logdir = tempfile.mkdtemp(prefix="kernelslot-collective-")
        self.sandbox = sandbox.current()  # every rank runs candidate code: each is sandboxed
        self.network: GroupNetwork | None = None
        try:
            if self.sandbox.group_netns:  # else (none mode, or no user namespaces) the host's network
                self.network = _group_network()
            self._spawn()
        except BaseException:
            self.close()
            raise

    def new_key(self) -> int:
        """A fresh storage key (unique for the session's lifetime)."""
        self._next_key += 1
        return self._next_key

    def rank_device(self, rank: int) -> torch.device:
        """Where group rank ``rank``'s tensors live (its GPU on CUDA: rank mod the device count)."""
        dev = torch.device(self.device)
        return torch.device("cuda", rank % torch.cuda.device_count()) if dev.type == "cuda" else torch.device("cpu")

    def _spawn(self) -> None:
        # gloo gives up on a stuck peer only well after the referee's own deadline has fired
        pg_timeout = 3 * self.timeout_s + 30
        for rank in range(self.world):
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            log = os.path.join(self._logdir, f"rank{rank}.log")
            scratch = tempfile.mkdtemp(prefix=f"rank{rank}-", dir=self._logdir)
            cmd = [sys.executable, "-m", "kernelslot.verify.collective.rank", "--fd", str(child.fileno()),
                   "--rank", str(rank), "--world", str(self.world), "--spare",
                   "--backend", self.backend, "--device", self.device,
                   "--timeout", str(pg_timeout), "--sandbox", self.sandbox.mode, "--scratch", scratch]
            with open(log, "wb") as fh:
                proc = self.sandbox.popen(cmd, scratch_dir=scratch, network=self.network, pass_fds=(child.fileno(),),
                                          env=self._child_env(scratch), stdout=fh, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            child.close()
            self.procs.append(proc)
            self.socks.append(parent)
            self.logs.append(log)
        deadline = time.monotonic() + STARTUP_S
        store = self._first(0, deadline)  # rank 0 hosts the process group's store; the others need its port
        if store.get("op") != "store" or not isinstance(store.get("port"), int):
            raise SessionError(f"{self._name(0)}: protocol: expected the store's port, got op={str(store.get('op'))[:40]!r}")
        for process in range(1, self.world):
            try:
                send_frame(self.socks[process], {"op": "store", "port": store["port"]})
            except OSError:
                raise SessionError(f"{self._name(process)}: {self.exit_reason(process)} while starting") from None
        waiting = set(range(self.world))
        pids: dict[int, int] = {}
        while waiting:
            ready, _, _ = select.select([self.socks[r] for r in waiting], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise SessionError(f"{self._name(min(waiting))}: did not join the process group within {STARTUP_S:.0f} s")
            for sock in ready:
                process = self.socks.index(sock)
                try:
                    msg = self._recv(process, deadline)
                except WireError:
                    raise SessionError(f"{self._name(process)}: {self.exit_reason(process)} while starting") from None
                if msg.get("op") == "ready":
                    waiting.discard(process)
                    pids[process] = self._host_pid(process, msg.get("pid"))
        self.pids = [pids[process] for process in range(1, self.world)]
        self._fp = [fpcontrol.observe(pid) for pid in self.pids]  # before any candidate code runs
        self.unobserved = next((r.error for r in self._fp if r.error), "") or ""

    def _host_pid(self, process: int, ns_pid: object) -> int:
        """The host pid of the rank that calls itself ``ns_pid`` in its sandbox (reported before any candidate code ran)."""
        for p in proctree.tree(self.procs[process].pid):
            if p.ns_pid == ns_pid and p.alive:
                return p.pid
        raise SessionError(f"{self._name(process)}: reported pid {str(ns_pid)[:20]}, which is not in its sandbox")

    def _first(self, process: int, deadline: float) -> dict:
        """The first frame of a starting rank (SessionError when it exits or stays silent)."""
        ready, _, _ = select.select([self.socks[process]], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise SessionError(f"{self._name(process)}: did not start within {STARTUP_S:.0f} s")
        try:
            return self._recv(process, deadline)
        except WireError:
            raise SessionError(f"{self._name(process)}: {self.exit_reason(process)} while starting") from None

    def _child_env(self, scratch: str) -> dict[str, str]:
        """The sandbox's neutral environment, the referee's import path (so a rank imports kernelslot and
        module candidates as here), the process-group libraries' settings, one thread each."""
        path = [p for p in sys.path if p and os.path.isdir(p)]
        extra = os.environ.get("PYTHONPATH")
        comm = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_", "CUDA_", "TORCH_", "KERNELSLOT_"))}
        # the built-in kernels' native library cache stays the referee's (read-only inside the sandbox)
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        # a private namespace has only lo (which NCCL skips unless named, and the hostname may not resolve to it)
        only_lo = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"} if self.network is not None else {}
        return {**neutral_env(self.sandbox, scratch), **comm, **only_lo, "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": cache,
                "PYTHONPATH": os.pathsep.join(path + ([extra] if extra else []))}

    @staticmethod
    def _name(process: int) -> str:
        """Process 0 is the spare rank; process ``r + 1`` is group rank ``r``."""
        return "the spare rank (global rank 0)" if process == 0 else f"rank {process - 1}"

    def exit_reason(self, process: int) -> str:
        """How the process ended (exit code or signal) and its output tail."""
        how, tail = self._ended(process)
        return how + (f"; output tail:\n{tail}" if tail else "")

    def _ended(self, process: int) -> tuple[str, str]:
        proc = self.procs[process]
        try:
            code = proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None
        how = f"process exited with code {code}" if code is not None else "process closed its channel"
        if code is not None and code < 0:
            how = f"process was killed by signal {signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else -code}"
        return how, _tail(self.logs[process])

    def _died(self, rank: int, when: str) -> str:
        """The failure line of group rank ``rank`` whose process ended; the session is broken and ``fatal``."""
        how, tail = self._ended(rank + 1)
        self.broken, self.fatal = True, f"rank {rank}: {how} ({when})"
        return f"rank {rank}: {how}" + (f"; output tail:\n{tail}" if tail else "") + f" ({when})"

    def _recv(self, process: int, deadline: float) -> dict:
        sock = self.socks[process]
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            return recv_frame(sock, MAX_REPLY_BYTES)[0]
        except (socket.timeout, TimeoutError):
            raise WireError("an incomplete frame (no complete reply before the deadline)") from None
        except OSError as exc:
            raise WireError(f"the channel failed ({exc})", eof=True) from None
        finally:
            sock.settimeout(None)

    def close(self) -> None:
        """Stop every rank; kill each rank's whole process group (candidate children included)."""
        for sock in self.socks:
            try:
                send_frame(sock, {"op": "stop"})
            except OSError:
                pass
        end = time.monotonic() + (0.0 if self.broken else 2.0)  # a broken session may hold stuck ranks
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.05, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the rank's session: it and anything it started
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        for sock in self.socks:
            sock.close()
        self.procs, self.socks = [], []
        shutil.rmtree(self._logdir, ignore_errors=True)  # logs and every rank's scratch
        if self.network is not None:
            self.network.close()
            self.network = None

    def exchange(self, frames: Sequence[tuple[dict, list[int]]], expect: str, seq: int, step: str
                 ) -> tuple[dict[int, dict], list[str]]:
        """Send group rank r ``frames[r]`` (an object and its fds); wait for each rank's ``expect`` reply.

        Returns ``(replies by rank, failure lines)``. A reply whose ``error`` is set (the candidate
        raised) gives its peers ``STOP_GRACE_S`` more to answer (they may wait for it inside a
        collective); ranks that then still owe a reply break the session without a line of their
        own. A rank that exits, writes anything but its reply, or overruns the deadline breaks
        the session and gets a line.
        """
        members = self.socks[1:]  # group rank r is process r + 1
        replies: dict[int, dict] = {}
        try:
            for rank, (obj, fds) in enumerate(frames):
                send_frame(members[rank], {**obj, "seq": seq}, fds)
        except OSError:
            return replies, [self._died(rank, f"before {step}")]
        stalls: dict[int, str] = {}
        deadline = time.monotonic() + self.timeout_s
        grace_end: float | None = None
        while True:
            pending = [r for r in range(self.group_size) if r not in replies]
            if not pending:
                return replies, []
            end = deadline if grace_end is None else min(deadline, grace_end)
            ready, _, _ = select.select([members[r] for r in pending], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                self.broken = True  # ranks still inside the call: stuck in a collective or hung
                if grace_end is not None:  # stuck behind a peer that raised: that rank's failure is the report
                    return replies, []
                self.fatal = f"a call timed out after the {self.timeout_s:g} s deadline ({step})"
                return replies, self._hung(pending, stalls, step)
            for sock in ready:
                rank = members.index(sock)
                try:
                    msg = self._recv(rank + 1, end)
                except WireError as exc:
                    if exc.eof:
                        return replies, [self._died(rank, f"during {step}")]
                    self.broken = True
                    return replies, [f"rank {rank}: protocol: on its reply channel, {exc} (during {step})"]
                if msg.get("op") == "stalled" and msg.get("seq") == seq:
                    stalls[rank] = str(msg.get("stack", ""))
                    continue
                if msg.get("op") != expect or msg.get("seq") != seq:
                    self.broken = True
                    return replies, [f"rank {rank}: protocol: expected the {expect!r} reply to message {seq} during "
                                     f"{step}, got op={str(msg.get('op'))[:40]!r} seq={str(msg.get('seq'))[:20]!r}: a "
                                     "frame not written by the rank's call loop (forged or replayed on its channel)"]
                replies[rank] = msg
                if msg.get("error") and grace_end is None:
                    grace_end = time.monotonic() + STOP_GRACE_S

    def _hung(self, pending: list[int], stalls: dict[int, str], step: str) -> list[str]:
        """Name every rank without a result; ranks stuck in their own code first."""
        lines = []
        for rank in pending:
            where = stuck_where(stalls.get(rank))
            lines.append((0 if "candidate code" in where and "torch.distributed" not in where else 1,
                          f"rank {rank}: timeout: no result within the {self.timeout_s:g} s deadline ({step}); {where}"))
        lines.sort()
        out = [text for _, text in lines]
        if all("torch.distributed" in text for text in out) and len(out) == self.group_size:
            out.append("every rank of the group is blocked inside torch.distributed: mismatched collectives, or a "
                       "collective over a group other than the supplied one (the default world group has a spare rank "
                       "that never joins)")
        return out

    # -- what the referee sees of the ranks from outside ---------------------------------------
    def threads(self) -> list[set[int]]:
        """The thread ids of every group rank now."""
        return [set(proctree.thread_cpu_ns(pid)) for pid in self.pids]

    def settle(self, window_s: float) -> tuple[dict[int, str], dict[int, list[str]]]:
        """Watch every group rank for ``window_s`` after a call: the ranks with a thread that keeps using CPU,
        described, and the ranks whose threads' floating-point control state changed (:meth:`numeric_changes`,
        read in the window's first half). The rule of :meth:`kernelslot.isolation.process.Watch.busy_threads`:
        the first half of the window is a grace period (a thread pool may spin down), a thread that used
        CPU in the second half is a suspect, and a suspect is busy if it used more than ``BUSY_FRACTION``
        of the next ``BUSY_CONFIRM_S``."""
        grace_end = time.monotonic() + window_s / 2
        numeric = self.numeric_changes()
        time.sleep(max(0.0, grace_end - time.monotonic()))
        return self._busy_threads(window_s), numeric

    def _busy_threads(self, window_s: float) -> dict[int, str]:
        """The busy-thread rule over the second half of the window (and a confirmation for suspects)."""
        first = [proctree.thread_cpu_ns(pid) for pid in self.pids]
        time.sleep(window_s / 2)
        second = [proctree.thread_cpu_ns(pid) for pid in self.pids]
        floor = max(2.5e5, 0.05 * window_s / 2 * 1e9)
        suspects = {r: [t for t in b if b[t][0] - a.get(t, (0,))[0] > floor] for r, (a, b) in enumerate(zip(first, second))}
        if not any(suspects.values()):
            return {}
        time.sleep(BUSY_CONFIRM_S)
        found = {}
        for rank, tids in suspects.items():
            third = proctree.thread_cpu_ns(self.pids[rank])
            busy = [(third[t][1], (third[t][0] - second[rank][t][0]) / 1e6) for t in tids
                    if t in third and third[t][0] - second[rank][t][0] > BUSY_FRACTION * BUSY_CONFIRM_S * 1e9]
            if busy:
                name, ms = busy[0]
                found[rank] = (f"{len(busy)} thread(s) kept using CPU after entry returned ({name!r}: {ms:.0f} ms of CPU in "
                               f"the next {BUSY_CONFIRM_S * 1e3:.0f} ms); all work must finish before entry returns "
                               "(an idle thread pool is fine)")
        return found

    def numeric_changes(self) -> dict[int, list[str]]:
        """Per group rank, what changed in its threads' floating-point control state (and scheduling) since
        the last reading, read from outside (:func:`kernelslot.isolation.fpcontrol.diff`); threads that
        could not be stopped to be read are a finding too (after one retry), as in the worker runner.
        Each reading replaces the last. Empty where tracing is not permitted (``unobserved`` says why)."""
        if self.unobserved:
            return {}
        changed = {}
        for rank, pid in enumerate(self.pids):
            now = fpcontrol.observe(pid)
            if now.error is None and not now.observed:
                time.sleep(0.05)
                now = fpcontrol.observe(pid)
            if now.error is not None:  # the rank is gone: its exchange's own outcome says why
                continue
            lines = fpcontrol.diff(self._fp[rank], now)
            unread = [t for t in now.threads.values() if t.control is None]
            if unread:
                lines.append(f"[not_observed] {len(unread)} rank thread(s) could not be stopped within 250 ms to read "
                             "their floating-point state")
            self._fp[rank] = now
            if lines:
                changed[rank] = lines
        return changed
