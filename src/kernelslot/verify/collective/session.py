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
``broken`` and must be closed; :meth:`close` kills every rank's process group.
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

from kernelslot.isolation import sandbox
from kernelslot.isolation.wire import WireError, recv_frame, send_frame
from kernelslot.isolation.netns import GroupNetwork, NetworkUnavailable
from kernelslot.isolation.sandbox import neutral_env

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
        proc = self.procs[process]
        try:
            code = proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None
        tail = _tail(self.logs[process])
        how = f"process exited with code {code}" if code is not None else "process closed its channel"
        if code is not None and code < 0:
            how = f"process was killed by signal {signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else -code}"
        return how + (f"; output tail:\n{tail}" if tail else "")

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
            self.broken = True
            return replies, [f"rank {rank}: {self.exit_reason(rank + 1)} (before {step})"]
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
                return replies, [] if grace_end is not None else self._hung(pending, stalls, step)
            for sock in ready:
                rank = members.index(sock)
                try:
                    msg = self._recv(rank + 1, end)
                except WireError as exc:
                    self.broken = True
                    why = self.exit_reason(rank + 1) if exc.eof else f"protocol: on its reply channel, {exc}"
                    return replies, [f"rank {rank}: {why} (during {step})"]
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
