"""The serving executor: a bundle's kernels run where they were verified, called through a doorbell.

Untrusted code runs only inside the sandbox it was verified in (docs/threat-model.md). An
:class:`Executor` serves one bundle's kernels to an engine from sandboxed worker processes of the
same kind as verification's (:class:`~kernelslot.isolation.worker.WorkerRunner`: the same zygote,
sandbox, seccomp filter, limits, environment and, inside the worker, the same call stack), one
worker per kernel source. The call path is built for serving:

* ``prepare`` runs in the worker and its result stays there; its tensor arguments (the engine's
  weights) are moved into shared memory *in place* and handed over **read-only** (a write faults in
  the worker, so a candidate cannot change the weights the incumbent and the audits read).
* Each call signature (kernel, argument shapes/dtypes/devices, prepared objects, scalar values) gets
  a *plan* once: staging tensors in shared memory (inputs read-only to the worker, outputs
  writable) registered with the worker together with the argument list. A call copies the inputs
  into their staging (activation-sized: kilobytes at decode), fills the outputs' staging with NaN
  (or the dtype's most negative value), rings an eventfd, waits on another, and copies the outputs
  back. The worker runs the plan's call through the same request path a socket request takes and
  writes its JSON reply into a shared control page. No pickle and no socket on the hot path.
* The engine's own tensors are never shared with candidate code: what the candidate writes reaches
  the engine only through the outputs copied back, and the trusted process keeps the inputs it
  copied from. Verdicts (audits, dispatch/router.py) are made in the trusted process.

A worker that crashes, hangs (``call_timeout_s``) or answers garbage is replaced; plans and
prepared objects are re-created in the new worker on their next use (prepare runs again from the
arguments kept here). :meth:`Executor.call` raises :class:`ExecutorCallError` for a call that
failed; the caller decides what runs instead.
"""
from __future__ import annotations

import json
import mmap
import os
import pickle
import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from kernelslot.isolation.process import Contained, WorkerProcess
from kernelslot.isolation.runner import RunnerError
from kernelslot.isolation.worker import PreparedHandle, WorkerRunner
from kernelslot.slots.base import Kernel, KernelSource

__all__ = ["Executor", "ExecutorCallError", "Prepared"]

_HEADER = struct.Struct("<qqq")  # as child._Doorbell.HEADER: sequence, plan key (-1: leave), reply length
PAGE_BYTES = 1 << 20
MAX_PLANS = 512  # per worker; beyond it every plan is dropped and re-made on use
_clock = time.perf_counter


class ExecutorCallError(RuntimeError):
    """A served call failed in the executor (``cause`` as in isolation/worker.py's tags)."""

    def __init__(self, message: str, cause: str):
        super().__init__(message)
        self.cause = cause


@dataclass(eq=False)
class Prepared:
    """The engine's stand-in for a prepared object living in an executor worker."""

    kernel: Kernel
    args: tuple
    handle: PreparedHandle | None = None

    def __repr__(self) -> str:
        return f"Prepared({self.kernel.name}, {self.handle!r})"


@dataclass(eq=False)
class _Plan:
    key: int
    generation: int
    args: list  # what the worker's argument list holds: staging tensors, prepared handles, values
    inputs: list[int]  # positions copied in before each call
    outputs: list[int]  # positions poisoned before and copied out after each call


@dataclass(eq=False)
class _Bell:
    """The referee's side of one worker's doorbell."""

    proc: WorkerProcess
    page: mmap.mmap
    ring: int
    done: int
    poller: Any
    active: bool = False
    seq: int = 0

    def close(self) -> None:
        self.page.close()
        for fd in (self.ring, self.done):
            os.close(fd)


@dataclass(eq=False)
class _Lane:
    """One kernel source's worker runner, plans and doorbell."""

    runner: WorkerRunner
    plans: dict[tuple, _Plan] = field(default_factory=dict)
    bell: _Bell | None = None
    next_plan: int = 0


def _poison(t: torch.Tensor) -> None:
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).min)


class Executor:
    """Serves kernels from sandboxed workers (see the module docstring); one per installation.

    ``runner_options``: keyword options of :class:`WorkerRunner` (the defaults are verification's:
    the same limits, so the worker looks the same from inside)."""

    def __init__(self, *, call_timeout_s: float = 30.0, **runner_options: Any):
        self.call_timeout_s = call_timeout_s
        self.runner_options = {"call_timeout_s": call_timeout_s, "settle_s": 0.0, **runner_options}
        self._lanes: dict[KernelSource, _Lane] = {}
        self.restarts = 0

    # -- public ----------------------------------------------------------------------------------
    @property
    def sandbox_mode(self) -> str:
        return next(iter(self._lanes.values())).runner.sandbox.mode if self._lanes else "not started"

    def prepare(self, kernel: Kernel, args: Sequence[Any]) -> Prepared:
        """Run ``kernel``'s prepare in its worker; the result stays there. Raises RunnerError."""
        prepared = Prepared(kernel, tuple(args))
        self._handle_for(prepared)
        return prepared

    def call(self, kernel: Kernel, args: Sequence[Any], outputs: Sequence[int]) -> int | None:
        """``entry(*args)`` in the worker: ``outputs`` are the positions it writes (copied back here).
        Returns the worker-reported ns of ``entry`` (advisory); raises :class:`ExecutorCallError`."""
        lane = self._lane(kernel)
        try:
            plan = self._plan(lane, kernel, args, outputs)
        except (Contained, RunnerError, ValueError) as exc:
            cause = exc.cause if isinstance(exc, Contained) else "start_failed"
            raise ExecutorCallError(f"could not set the call up in the executor: {exc}", cause) from None
        for i in plan.inputs:
            plan.args[i].copy_(args[i])
        for i in plan.outputs:
            _poison(plan.args[i])
        reply = self._ring(lane, plan)
        if "error" in reply:
            raise ExecutorCallError(str(reply["error"]), str(reply.get("cause") or "exception"))
        if reply.get("returned") is not None:
            raise ExecutorCallError(f"entry returned {reply['returned']} (the ABI says None)", "returned_value")
        if reply.get("global_state"):
            raise ExecutorCallError("the call changed process-wide numeric state: " + "; ".join(reply["global_state"]),
                                    "global_state_changed")
        for i in plan.outputs:
            args[i].copy_(plan.args[i])
        return reply.get("worker_ns")

    def numeric_state_changes(self, kernel: Kernel) -> list[str]:
        """What changed in the floating-point control state of ``kernel``'s worker threads since the last
        reading, read from outside through ptrace (isolation/fpcontrol.py); a change replaces the worker."""
        lane = self._lanes.get(kernel.origin())
        proc = lane.runner._proc if lane else None
        if proc is None:
            return []
        self._leave(lane)
        lines = lane.runner._fp_changes(proc)
        if lines:
            self._replace(lane)
        return lines

    def close(self) -> None:
        for lane in self._lanes.values():
            if lane.bell is not None:
                lane.bell.close()
            lane.runner.close()
        self._lanes.clear()

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- lanes, prepared objects and plans --------------------------------------------------------
    def _lane(self, kernel: Kernel) -> _Lane:
        source = kernel.origin()
        lane = self._lanes.get(source)
        if lane is None:
            lane = self._lanes[source] = _Lane(WorkerRunner(**self.runner_options))
        return lane

    def _handle_for(self, prepared: Prepared) -> PreparedHandle:
        lane = self._lane(prepared.kernel)
        proc = lane.runner._proc
        h = prepared.handle
        if h is not None and proc is not None and h.generation == proc.generation and h.key in proc.prepared:
            return h
        self._leave(lane)
        lane.runner.share(prepared.args, read_only=True)
        prepared.handle = lane.runner.prepare(prepared.kernel, prepared.args)
        return prepared.handle

    @staticmethod
    def _signature(kernel: Kernel, args: Sequence[Any], outputs: Sequence[int]) -> tuple:
        parts: list[Any] = [kernel.origin(), tuple(outputs)]
        for a in args:
            if isinstance(a, torch.Tensor):
                parts.append(("t", tuple(a.shape), a.dtype, a.device))
            elif isinstance(a, Prepared):
                parts.append(("p", id(a)))
            else:
                parts.append(("v", type(a).__name__, repr(a)))
        return tuple(parts)

    def _plan(self, lane: _Lane, kernel: Kernel, args: Sequence[Any], outputs: Sequence[int]) -> _Plan:
        sig = self._signature(kernel, args, outputs)
        plan = lane.plans.get(sig)
        proc = lane.runner._proc
        if plan is not None and proc is not None and plan.generation == proc.generation:
            if all(not isinstance(a, Prepared) or self._handle_for(a) is plan.args[i] for i, a in enumerate(args)):
                return plan
        out = set(outputs)
        worker_args: list[Any] = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                staging = torch.empty(a.shape, dtype=a.dtype, device=a.device)
                lane.runner.share(staging, read_only=i not in out)
                worker_args.append(staging)
            elif isinstance(a, Prepared):
                worker_args.append(self._handle_for(a))
            else:
                worker_args.append(a)
        self._leave(lane)
        release: list[int] = []
        if len(lane.plans) >= MAX_PLANS:
            release = [p.key for p in lane.plans.values()]
            lane.plans.clear()
        lane.next_plan += 1
        source = kernel.origin()
        proc = lane.runner._worker_for(source)
        reply, _ = lane.runner._request(proc, "plan", source, worker_args, lane.runner.prepare_timeout_s,
                                        handle=lane.next_plan, release_plans=release)
        if "error" in reply:
            raise RunnerError(str(reply["error"]))
        plan = _Plan(lane.next_plan, proc.generation, worker_args,
                     [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in out],
                     [i for i in outputs if isinstance(args[i], torch.Tensor)])
        lane.plans[sig] = plan
        return plan

    # -- the doorbell ------------------------------------------------------------------------------
    def _enter(self, lane: _Lane) -> _Bell:
        proc = lane.runner._proc
        bell = lane.bell
        if bell is not None and bell.proc is not proc:
            bell.close()
            bell = lane.bell = None
        fds: list[int] = []
        if bell is None:
            page_fd = os.memfd_create("kernelslot-doorbell", os.MFD_CLOEXEC)
            os.ftruncate(page_fd, PAGE_BYTES)
            page = mmap.mmap(page_fd, PAGE_BYTES)
            ring, done = os.eventfd(0, os.EFD_CLOEXEC), os.eventfd(0, os.EFD_CLOEXEC)
            poller = select.poll()
            poller.register(done, select.POLLIN)
            poller.register(proc.conn.fileno(), select.POLLIN | select.POLLHUP)
            bell = lane.bell = _Bell(proc, page, ring, done, poller)
            fds = [page_fd, ring, done]
        if not bell.active:
            try:
                proc.conn.send_bytes(pickle.dumps({"op": "doorbell"}))
                if fds:
                    socket.send_fds(proc.fd_sock, [b"F"], fds)
                ok = proc.conn.poll(self.call_timeout_s) and proc.conn.recv_bytes(64) == b"{}"
            except (EOFError, OSError):
                ok = False
            finally:
                if fds:
                    os.close(fds[0])
            if not ok:
                self._replace(lane)
                raise ExecutorCallError("the worker did not enter its doorbell loop", "protocol")
            bell.active = True
        return bell

    def _leave(self, lane: _Lane) -> None:
        """Back to socket requests (prepare, plan, load): the worker answers ``{}`` on its socket."""
        bell = lane.bell
        if bell is None or not bell.active:
            return
        bell.active = False
        bell.seq += 1
        _HEADER.pack_into(bell.page, 0, bell.seq, -1, 0)
        try:
            os.eventfd_write(bell.ring, 1)
            ok = bell.proc.conn.poll(self.call_timeout_s) and bell.proc.conn.recv_bytes(64) == b"{}"
        except (EOFError, OSError):
            ok = False
        if not ok:
            self._replace(lane)

    def _ring(self, lane: _Lane, plan: _Plan) -> dict:
        bell = self._enter(lane)
        bell.seq += 1
        _HEADER.pack_into(bell.page, 0, bell.seq, plan.key, 0)
        os.eventfd_write(bell.ring, 1)
        deadline = _clock() + self.call_timeout_s
        while True:
            events = bell.poller.poll(max(0.0, deadline - _clock()) * 1000)
            if any(fd == bell.done for fd, _ in events):
                os.eventfd_read(bell.done)
                break
            if events:  # the worker's socket: it died, or wrote on it from candidate code
                cause, why = bell.proc.exit_reason()
                tail = bell.proc.log_tail()
                self._replace(lane)
                raise ExecutorCallError(why + (f"\nworker log:\n{tail}" if tail else ""), cause)
            if _clock() >= deadline:
                self._replace(lane)
                raise ExecutorCallError(f"timed out after {self.call_timeout_s:g}s; the worker was killed", "timeout")
        seq, _, length = _HEADER.unpack_from(bell.page, 0)
        try:
            if seq != bell.seq or not 0 < length <= PAGE_BYTES - _HEADER.size:
                raise ValueError(f"sequence {seq} (expected {bell.seq}), length {length}")
            reply = json.loads(bell.page[_HEADER.size:_HEADER.size + length])
            if not isinstance(reply, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            self._replace(lane)
            raise ExecutorCallError(f"the worker's reply is malformed ({exc}); was the page written by candidate code?",
                                    "protocol") from None
        return reply

    def _replace(self, lane: _Lane) -> None:
        """Kill the lane's worker; the next use starts a fresh one (plans and prepares re-made)."""
        if lane.bell is not None:
            lane.bell.close()
            lane.bell = None
        lane.plans.clear()
        lane.runner._discard()
        self.restarts += 1
