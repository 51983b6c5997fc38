"""``WorkerRunner``: candidate code runs in a separate worker process, never in the referee.

Contract (the runner boundary; docs/threat-model.md):

* The referee owns every tensor. :meth:`WorkerRunner.share` moves CPU storages into POSIX shared
  memory *in place* (same tensor objects, every view follows; data pointers then stay stable for
  the rest of the run), so the pipeline must call it before it snapshots inputs or records output
  identities. CUDA storages are handed over with CUDA IPC and need no preparation.
* The worker (forked by a zygote, ``python -m kernelslot.isolation.child``: a clean
  interpreter that never runs candidate code; the worker runs in its own session) loads the
  candidate module itself, so import-time side effects stay there. It maps each
  storage once, runs ``prepare``/``entry`` and reports, in JSON, what it saw: returned value,
  traceback, argument identity relative to the shared storages, retained positions, threads left
  running. ``prepare`` results live only in the worker; the referee holds a :class:`PreparedHandle`.
* Containment: each call has a deadline (``call_timeout_s``), ``prepare`` its own
  (``prepare_timeout_s``); a hang is killed, a crash is reported by signal name or exit code, an
  allocation beyond ``memory_limit_gib`` (an address-space cap, CPU only) fails inside the worker.
  After any of those, or a thread left running, the worker is discarded; the next request gets a
  fresh one (a spare is kept warm), so a later profile re-runs ``prepare``.
* A worker is bound to one kernel source (file or module); another source gets another worker,
  so one candidate's monkeypatching never reaches another's code.
* Every check is made by the referee. After a checked call it also waits ``settle_s`` and
  re-reads every tensor argument: a write after ``entry`` returned is a failure (``late_write``).
* Timing: ``CallObservation.elapsed_s`` is the referee's round trip (IPC included, seconds);
  ``worker_s`` is the in-worker time of ``entry`` alone (advisory; ``None`` when implausible).

Failures in an observation carry a cause tag, also the last line of ``error``:
``exception, timeout, crash, exit, out_of_memory, thread_left_running, late_write, load_failed,
start_failed, protocol``.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import shutil
import signal
import socket
import tempfile
import time
import weakref
from typing import Any, Callable, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef, reduce_tensor

from kernelslot.isolation import fpcontrol, proctree
from kernelslot.isolation.child import FDS_PER_MESSAGE
from kernelslot.isolation.observe import bits_equal, translate_meta
from kernelslot.isolation.process import Contained, Limits, Watch, WorkerProcess, Zygote
from kernelslot.isolation.runner import (CallObservation, GlobalStateChanged, Runner, RunnerError, StagedBatch,
                                         judge_direct_evidence, state_changed_text)
from kernelslot.isolation.sandbox import Sandbox, current as current_sandbox
from kernelslot.slots.base import Kernel, KernelSource

__all__ = ["WorkerRunner", "PreparedHandle", "RESTART_CAUSES"]

_clock = time.perf_counter  # bound at import: candidate code never runs in this process anyway
MAX_REPLY_BYTES = 8 << 20
# Causes after which the worker is not trusted any more and is replaced.
RESTART_CAUSES = frozenset({"timeout", "crash", "exit", "out_of_memory", "thread_left_running", "late_write", "protocol",
                            "process_left_running", "process_limit"})


class PreparedHandle:
    """The referee's stand-in for a prepared object that lives in a worker."""

    def __init__(self, key: int, generation: int, kernel: str):
        self.key, self.generation, self.kernel = key, generation, kernel

    def __repr__(self) -> str:
        return f"PreparedHandle({self.kernel}, key={self.key}, worker={self.generation})"


@dataclasses.dataclass
class _Shared:
    ref: StorageWeakRef
    base_ptr: int
    entry: tuple  # registration message for a worker
    fd: int | None = None  # CPU storages: the descriptor sent with the registration
    nbytes: int = 0
    owns_fd: bool = False  # ``fd`` is ours to close when the storage dies (a read-only duplicate)


class _ArgPickler(pickle.Pickler):
    def __init__(self, buf: io.BytesIO, runner: "WorkerRunner", proc: WorkerProcess, register: list):
        super().__init__(buf, protocol=pickle.HIGHEST_PROTOCOL)
        self.runner, self.proc, self.register = runner, proc, register

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            key = self.runner._key_for(obj, self.proc, self.register)
            return ("t", key, obj.storage_offset(), tuple(obj.shape), tuple(obj.stride()), str(obj.dtype).removeprefix("torch."))
        if isinstance(obj, PreparedHandle):
            if obj.generation != self.proc.generation or obj.key not in self.proc.prepared:
                raise Contained("load_failed", f"{obj!r} belongs to a worker that was replaced; prepare() again")
            return ("p", obj.key)
        return None


class WorkerRunner(Runner):
    """Runs candidates in sandboxed worker processes with shared-memory tensors, deadlines and containment."""

    name = "worker"

    def __init__(
        self,
        call_timeout_s: float = 30.0,
        prepare_timeout_s: float = 120.0,
        *,
        memory_limit_gib: float | None = 4.0,
        settle_s: float = 0.02,
        start_timeout_s: float = 120.0,
        keep_spare: bool = True,
        sandbox: Sandbox | str | None = None,
        max_processes: int = 64,
    ):
        if call_timeout_s <= 0 or prepare_timeout_s <= 0:
            raise ValueError(f"WorkerRunner: timeouts must be positive (call {call_timeout_s}, prepare {prepare_timeout_s})")
        self.call_timeout_s, self.prepare_timeout_s, self.start_timeout_s = call_timeout_s, prepare_timeout_s, start_timeout_s
        self.memory_bytes = int(memory_limit_gib * (1 << 30)) if memory_limit_gib else 0
        self.limits = Limits(memory_bytes=self.memory_bytes, max_processes=max_processes,
                             cpu_s=int(max(3600, 20 * prepare_timeout_s)))
        self.settle_s, self.keep_spare = settle_s, keep_spare
        self.sandbox = sandbox if isinstance(sandbox, Sandbox) else current_sandbox(sandbox)
        self.name = f"worker/{self.sandbox.mode}"  # the sandbox in force shows in every report header
        self._log_dir = tempfile.mkdtemp(prefix="kernelslot-worker-")
        self._scratch = tempfile.mkdtemp()  # the sandbox's /tmp: a neutral name
        self._watch = Watch(self.limits)
        self._generation = 0
        self._next_key = 0
        self._zygote: Zygote | None = None
        self._proc: WorkerProcess | None = None
        self._spare: WorkerProcess | None = None
        self._shared: dict[int, _Shared] = {}  # key -> storage
        self._key_of: dict[int, int] = {}  # StorageImpl address -> key
        self._dead_prepared: list[int] = []
        self._incumbent: WorkerRunner | None = None
        self._visible: set[str] = set()  # bundle paths under the sandbox's private /tmp, shown read-only
        self._unavailable: dict[KernelSource, str] = {}  # sources that failed to load or timed out: why
        self.restarts = 0  # workers replaced after a contained failure
        self._frozen: list[int] = []  # workers stopped by freeze(), resumed by thaw() (and before every request)
        self.fp_unobserved: str | None = None  # why a worker's FP state could not be read from outside, if it could not
        self._live: list[WorkerProcess] = []
        self._zygotes: list[Zygote] = []
        self._finalizer = weakref.finalize(self, WorkerRunner._cleanup, self._live, self._zygotes,
                                           (self._log_dir, self._scratch), self._shared)

    # -- public API ------------------------------------------------------------------------------
    def share(self, obj: Any, *, read_only: bool = False) -> Any:
        """Move every CPU tensor storage reachable in ``obj`` into shared memory, in place;
        ``read_only``: workers map those storages read-only (a storage shared before keeps its mode)."""
        for t in _tensors(obj):
            if not t.is_cuda and t.untyped_storage().nbytes():
                self._share_cpu(t.untyped_storage(), read_only)
        return obj

    def unavailable(self, kernel: Kernel) -> str | None:
        """Why ``kernel`` is not run any more (it failed to load, or a call timed out), else None."""
        try:
            return self._unavailable.get(kernel.origin())
        except ValueError:
            return None

    def prepare(self, kernel: Kernel, prepare_args: Sequence[Any]) -> PreparedHandle:
        self.thaw()
        try:
            source = kernel.origin()
            if source.prepare is None:
                raise RunnerError(f"{kernel.name or source.entry}: the slot needs prepare() but the kernel has none")
            proc = self._worker_for(source)
            self._next_key += 1
            key = self._next_key
            reply, _ = self._request(proc, "prepare", source, tuple(prepare_args), self.prepare_timeout_s, handle=key)
        except Contained as c:
            raise RunnerError(f"prepare() failed: {c.message}\n[{c.cause}]") from None
        except (ValueError, RunnerError) as exc:
            raise RunnerError(f"prepare() could not start: {exc}") from None
        if "error" in reply:
            if reply.get("cause") == "out_of_memory":
                self._discard()
            raise RunnerError(f"prepare() raised:\n{reply['error']}\n[{reply.get('cause', 'exception')}]")
        if reply.get("global_state"):
            changed = self._state_changed(reply)
            raise GlobalStateChanged("prepare(): " + changed[0])
        outside = self._fp_changes(proc)
        if outside:
            self._discard()
            raise GlobalStateChanged("prepare(): " + self._outside_text(outside, False))
        proc.prepared.add(key)
        handle = PreparedHandle(key, proc.generation, kernel.name or source.entry)
        weakref.finalize(handle, self._dead_prepared.append, key)
        return handle

    def call(self, kernel: Kernel, args: Sequence[Any], *, check_retention: bool = True, private: bool = False,
             scratch: bool = False) -> CallObservation:
        """Call ``entry`` in the worker. ``check_retention`` also enables the settle re-read."""
        self.thaw()
        obs = CallObservation()
        proc = None
        try:
            source = kernel.origin()
            proc = self._worker_for(source)
            reply, obs.elapsed_s = self._request(proc, "call", source, list(args), self.call_timeout_s, check=check_retention,
                                                **({"private": True} if private else {}), **({"scratch": True} if scratch else {}))
            self._observe(reply, args, obs)
            judge_direct_evidence(kernel, obs)
        except Contained as c:
            obs.error, obs.cause, obs.elapsed_s = f"{c.message}\n[{c.cause}] {c.message.splitlines()[0]}", c.cause, c.elapsed_s
        except ValueError as exc:
            obs.error, obs.cause = f"[load_failed] {exc}", "load_failed"
        except RunnerError as exc:
            obs.error, obs.cause = f"[start_failed] {exc}", "start_failed"
        if obs.error is None and check_retention and self.settle_s > 0 and proc is self._proc:
            self._settle(proc, args, obs)
        self._judge_outside(proc, obs)
        if obs.cause in RESTART_CAUSES:
            self._discard()
        return obs

    # -- numeric state read from outside the worker (isolation/fpcontrol.py) ---------------------
    def _fp_baseline(self, proc: WorkerProcess) -> None:
        """The first outside reading of a fresh worker (before it imports a candidate); when the
        kernel refuses the reading, the in-worker snapshot is the only signal (``fp_unobserved``)."""
        reading = fpcontrol.observe(proc.pid)
        proc.fp = reading if reading.error is None else None
        if reading.error is not None:
            self.fp_unobserved = reading.error

    def _fp_changes(self, proc: WorkerProcess) -> list[str]:
        """What changed in the worker's threads' floating-point control state since the last reading;
        threads that could not be stopped to be read are a finding too (after one retry)."""
        if proc.fp is None or proc is not self._proc:
            return []
        now = fpcontrol.observe(proc.pid)
        if now.error is None and not now.observed:
            time.sleep(0.05)
            now = fpcontrol.observe(proc.pid)
        if now.error is not None:  # the worker is gone: its request's own outcome says why
            return []
        lines = fpcontrol.diff(proc.fp, now)  # type: ignore[arg-type]
        unread = [t for t in now.threads.values() if t.control is None]
        if unread:
            lines.append(f"[not_observed] {len(unread)} worker thread(s) could not be stopped within 250 ms to read "
                         "their floating-point state")
        proc.fp = now
        return lines

    @staticmethod
    def _outside_text(lines: list[str], inside_saw: bool) -> str:
        text = state_changed_text([f"{line} (read from outside the worker)" for line in lines], ["the worker was replaced"])
        return text if inside_saw else text + "; the worker's own snapshot reported no change (replaced by the candidate?)"

    def _judge_outside(self, proc: WorkerProcess | None, obs: CallObservation) -> None:
        """After a call that returned: the outside reading; a change fails ``global_state_changed`` and
        replaces the worker (state set from inside cannot be put back from outside)."""
        if obs.error is not None or proc is None:
            return
        outside = self._fp_changes(proc)
        if outside:
            obs.state_changed = [*obs.state_changed, self._outside_text(outside, bool(obs.state_changed))]
            self._discard()

    # -- a batch in three requests: ``stage_batch`` hands over the argument lists (untimed), ``run_staged``
    # makes the calls back to back (the referee's clock: this request's round trip), ``report_staged``
    # brings back what each call returned and left (untimed); then one settle window over every
    # argument of the batch (a late write or busy thread fails the last call)
    @staticmethod
    def _contained(staged: StagedBatch, step: Callable[[], None]) -> None:
        """Run one step of ``staged``; a failure becomes its ``error`` (the observation that ends it)."""
        try:
            step()
        except Contained as c:
            staged.error = CallObservation(error=f"{c.message}\n[{c.cause}] {c.message.splitlines()[0]}", cause=c.cause,
                                           elapsed_s=c.elapsed_s)
        except ValueError as exc:
            staged.error = CallObservation(error=f"[load_failed] {exc}", cause="load_failed")
        except RunnerError as exc:
            staged.error = CallObservation(error=f"[start_failed] {exc}", cause="start_failed")

    def stage_batch(self, kernel: Kernel, batch: Sequence[Sequence[Any]], *, check_retention: bool = True) -> StagedBatch:
        self.thaw()
        staged = StagedBatch(kernel, batch, check_retention)

        def stage() -> None:
            source = kernel.origin()
            staged.state = proc = self._worker_for(source)
            reply, _ = self._request(proc, "stage_batch", source, [list(a) for a in batch], self.call_timeout_s,
                                     check=check_retention)
            if "error" in reply:
                raise Contained(str(reply.get("cause") or "load_failed"), str(reply["error"]).strip() or "staging failed")
        self._contained(staged, stage)
        return staged

    def run_staged(self, staged: StagedBatch) -> None:
        if staged.error is not None:
            return
        woken = bool(self._frozen)
        self.thaw()

        def run() -> None:
            with proctree.pinned(staged.state.pid, proctree.timed_cpu()):  # every runner's timed calls on one CPU
                if woken:  # a stopped worker is woken by an untimed request first: its wake-up is no part of the batch
                    self._request(staged.state, "load", staged.kernel.origin(), [], self.call_timeout_s)
                _, staged.elapsed_s = self._request(staged.state, "run_staged", staged.kernel.origin(), [],
                                                    self.call_timeout_s, guard=False)  # the guard spans stage to report
        self._contained(staged, run)

    def finish_batch(self, staged: StagedBatch) -> tuple[list[CallObservation], float]:
        self.thaw()
        observations: list[CallObservation] = []
        proc, batch, elapsed = staged.state, staged.batch, staged.elapsed_s

        def report() -> None:
            reply, _ = self._request(proc, "report_staged", staged.kernel.origin(), [], self.call_timeout_s)
            staged.state_changed = self._state_changed(reply) if reply.get("global_state") else []
            calls = reply.get("calls")
            if not isinstance(calls, list) or not 1 <= len(calls) <= len(batch):
                raise Contained("protocol", f"the worker answered a batch of {len(batch)} calls with "
                                            f"{len(calls) if isinstance(calls, list) else 'no'} observations", elapsed)
            for one, args in zip(calls, batch):
                obs = CallObservation(elapsed_s=elapsed)  # the whole request bounds each in-worker time
                if not isinstance(one, dict):
                    raise Contained("protocol", "a batch observation is not an object", elapsed)
                self._observe(one, args, obs)
                judge_direct_evidence(staged.kernel, obs)
                obs.elapsed_s, obs.state_changed = elapsed / len(calls), staged.state_changed
                observations.append(obs)
        if staged.error is None:
            self._contained(staged, report)
        if staged.error is not None:
            observations.append(staged.error)
        last = observations[-1]
        if last.error is None and staged.check_retention and self.settle_s > 0 and proc is self._proc:
            self._settle(proc, [a for args in batch for a in args], last)
        self._judge_outside(proc, last)
        if last.cause in RESTART_CAUSES:
            self._discard()
        return observations, (observations[0].elapsed_s if observations else 0.0)

    def freeze(self) -> None:
        """SIGSTOP every worker of this runner and wait until each of its threads is stopped."""
        self._frozen = proctree.stop([p.pid for p in self._live if p.pid]) if self._live else []

    def thaw(self) -> None:
        if self._frozen:
            proctree.resume(self._frozen)
            self._frozen = []

    def incumbent_runner(self) -> Runner:
        """A sibling runner for the incumbent, in a sandbox of its own, so a candidate cannot reach it, and
        with the same limits: a memory cap puts a worker in a cgroup of its own, whose page charging a
        worker without one would not pay, and the timed calls compare like with like."""
        if self._incumbent is None:
            from kernelslot.kernels.native import build

            build.loaded()  # built (and verified) here: inside its sandbox the cache is read-only
            self._incumbent = WorkerRunner(self.call_timeout_s, self.prepare_timeout_s,
                                           memory_limit_gib=self.memory_bytes / (1 << 30) or None,
                                           settle_s=self.settle_s, start_timeout_s=self.start_timeout_s, keep_spare=False,
                                           sandbox=self.sandbox)
        return self._incumbent

    def close(self) -> None:
        self.thaw()
        self._proc = self._spare = self._zygote = None
        if self._incumbent is not None:
            self._incumbent.close()
        self._finalizer()

    def __enter__(self) -> "WorkerRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- workers ---------------------------------------------------------------------------------
    @staticmethod
    def _cleanup(live: list, zygotes: list, dirs: tuple, shared: dict) -> None:
        for proc in live:
            proc.kill()
        live.clear()
        for entry in shared.values():  # the read-only descriptors are ours: each keeps its memory alive
            if entry.owns_fd:
                os.close(entry.fd)
        shared.clear()
        for z in zygotes:
            z.close()
        zygotes.clear()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)

    def _zygote_now(self) -> Zygote:
        if self._zygote is None or not self._zygote.alive():
            if self._zygote is not None:  # killed from inside: its workers died with it
                self._drop_sandbox()
            self._zygote = Zygote(self.sandbox, self._scratch, os.path.join(self._log_dir, "zygote.log"), self.start_timeout_s,
                                  self._visible)
            self._zygotes.append(self._zygote)
        return self._zygote

    def _drop_sandbox(self) -> None:
        """Kill every worker and the sandbox itself; the next request starts a fresh one."""
        for proc in list(self._live):
            proc.kill()
        self._live.clear()
        self._proc = self._spare = None
        if self._zygote is not None:
            self._zygote.close()
            self._zygotes.remove(self._zygote)
            self._zygote = None

    def _spawn(self) -> WorkerProcess:
        self._generation += 1
        proc = WorkerProcess(self._zygote_now(), self._generation, self.limits, self._log_dir, self.start_timeout_s)
        self._live.append(proc)
        return proc

    def _discard(self, failed: bool = True) -> None:
        """Kill the current worker; ``failed`` counts it in ``restarts`` (not a switch of kernel source)."""
        if self._proc is not None:
            self._proc.kill()
            if self._proc in self._live:
                self._live.remove(self._proc)
            self._proc = None
            self.restarts += failed

    def _worker_for(self, source: KernelSource) -> WorkerProcess:
        if source in self._unavailable:
            raise Contained("not_run", f"not run: {self._unavailable[source]}")
        where = source.file or source.module or source.sealed or ""
        self._show(source)
        if self._proc is not None and (self._proc.conn.poll(0) or not self._proc.zygote.alive()):  # died or wrote between calls
            self._discard()
        if self._proc is not None and self._proc.source not in (None, where):
            self._discard(failed=False)
            if self._spare is not None:  # it lived beside the other source's code, which could signal it
                self._spare.kill()
                self._live.remove(self._spare)
                self._spare = None
        if self._spare is not None and not self._spare.zygote.alive():
            self._spare = None
        if self._proc is None:
            proc, self._spare = (self._spare or self._spawn()), None
            self._await_ready(proc)
            self._fp_baseline(proc)
            self._proc = proc
            if self.keep_spare:
                self._spare = self._spawn()
        self._proc.source = where
        if source not in self._proc.loaded:
            self._load(self._proc, source)
        return self._proc

    def _show(self, source: KernelSource) -> None:
        """A source file under ``/tmp`` is hidden by the sandbox's private ``/tmp``: restart it showing the file's directory."""
        where = source.file or (source.sealed.rsplit("@", 1)[0] if source.sealed else None)
        if not where or not self.sandbox.isolated:
            return
        path = os.path.realpath(where)
        parent = os.path.dirname(path)
        tmp = os.path.realpath(tempfile.gettempdir())
        if not (parent + "/").startswith(("/tmp/", tmp + "/")) or any((parent + "/").startswith(v + "/") for v in self._visible):
            return
        self._visible.add(path if parent in ("/tmp", tmp) else parent)
        if self._zygote is not None:
            self._drop_sandbox()

    def _load(self, proc: WorkerProcess, source: KernelSource) -> None:
        """Import the candidate (its own request and deadline); a failure is final for this source."""
        try:
            reply, _ = self._request(proc, "load", source, [], self.prepare_timeout_s)
        except Contained as c:
            message = (f"importing the candidate did not finish within {self.prepare_timeout_s:g}s; the worker was killed"
                       if c.cause == "timeout" else f"while importing the candidate: {c.message}")
            self._unavailable[source] = f"the candidate failed to load ({c.cause}: {message.splitlines()[0]})"
            raise Contained(c.cause, message, c.elapsed_s) from None
        if "error" in reply:
            text = str(reply["error"]).strip()
            self._unavailable[source] = f"the candidate failed to load: {text.splitlines()[-1]}"
            raise Contained(str(reply.get("cause") or "load_failed"), text)
        proc.loaded.add(source)

    def _await_ready(self, proc: WorkerProcess) -> None:
        if not proc.conn.poll(self.start_timeout_s):
            proc.kill()
            self._live.remove(proc)
            raise RunnerError(f"the worker did not start within {self.start_timeout_s:g}s:\n{proc.log_tail()}")
        try:
            json.loads(proc.conn.recv_bytes(MAX_REPLY_BYTES))
        except (EOFError, OSError, ValueError):
            proc.kill()
            self._live.remove(proc)
            raise RunnerError(f"the worker failed to start (exit code {proc.exitcode}):\n{proc.log_tail()}") from None

    # -- shared storages -------------------------------------------------------------------------
    def _share_cpu(self, storage: torch.UntypedStorage, read_only: bool = False) -> int:
        known = self._key_of.get(storage._cdata)
        if known is not None and not self._shared[known].ref.expired():
            return known
        try:
            fd, nbytes = storage._share_fd_cpu_()
        except RuntimeError as exc:
            raise RunnerError(f"cannot move a CPU storage of {storage.nbytes()} bytes into shared memory ({exc}); "
                              "allocate the tensor with torch (not from_blob/numpy) so it can be shared") from None
        if read_only:  # a descriptor of its own that cannot map the memory writable (closed with the entry)
            fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
            key = self._remember(storage, ("fd_ro", nbytes), fd=fd)
            self._shared[key].owns_fd = True
            return key
        return self._remember(storage, ("fd", nbytes), fd=fd)

    def _remember(self, storage: torch.UntypedStorage, entry: tuple, fd: int | None = None) -> int:
        self._next_key += 1
        key = self._next_key
        self._shared[key] = _Shared(StorageWeakRef(storage), storage.data_ptr(), (entry[0], key, *entry[1:]), fd, storage.nbytes())
        self._key_of[storage._cdata] = key
        return key

    def _key_for(self, t: torch.Tensor, proc: WorkerProcess, register: list) -> int:
        if t.layout != torch.strided:
            raise Contained("load_failed", f"cannot hand a {t.layout} tensor to the worker; only strided tensors are supported")
        storage = t.untyped_storage()
        known = self._key_of.get(storage._cdata)
        if known is None or self._shared[known].ref.expired():
            if storage.nbytes() == 0:
                known = self._remember(storage, ("empty", str(t.device)))
            elif t.is_cuda:
                whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))
                rebuild, rebuild_args = reduce_tensor(whole)
                known = self._remember(storage, ("cuda", rebuild, rebuild_args))
            else:
                known = self._share_cpu(storage)  # first sight: shared in place (data_ptr changes once)
        if known not in proc.registered:
            register.append(self._shared[known])
            proc.registered.add(known)
        return known

    def _released(self, proc: WorkerProcess) -> list[int]:
        dead = [k for k, s in self._shared.items() if s.ref.expired()]
        for k in dead:
            self._key_of = {c: v for c, v in self._key_of.items() if v != k}
            if self._shared[k].owns_fd:
                os.close(self._shared[k].fd)
            del self._shared[k]
        gone = [k for k in dead if k in proc.registered]
        proc.registered.difference_update(gone)
        return gone

    # -- one request -----------------------------------------------------------------------------
    def _request(self, proc: WorkerProcess, op: str, source: KernelSource, args: Any, timeout: float, **extra: Any) -> tuple[dict, float]:
        register: list[_Shared] = []
        buf = io.BytesIO()
        try:
            _ArgPickler(buf, self, proc, register).dump(args)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise Contained("start_failed", f"cannot send the {op} arguments to the worker ({exc}); "
                                            "arguments must be tensors or picklable values") from None
        dead_prepared, self._dead_prepared = [k for k in self._dead_prepared if k in proc.prepared], []
        proc.prepared.difference_update(dead_prepared)
        msg = {"op": op, "kernel": source, "args": buf.getvalue(), "register": [s.entry for s in register],
               "release": self._released(proc), "release_prepared": dead_prepared, **extra}
        fds = [s.fd for s in register if s.fd is not None]
        proc.shared_bytes = sum(s.nbytes for k, s in self._shared.items() if k in proc.registered)
        start = _clock()
        try:
            proc.conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
            for i in range(0, len(fds), FDS_PER_MESSAGE):
                socket.send_fds(proc.fd_sock, [b"F"], fds[i:i + FDS_PER_MESSAGE])
            try:
                answered = self._watch.wait(proc, self._worker_pids() - {proc.pid}, timeout, start)
            except Contained:
                self._drop_sandbox()  # over a limit: nothing in that sandbox is kept
                self.restarts += 1
                raise
            if not answered:
                self._discard()
                self._kill_strays(proc)
                if op != "load":
                    self._unavailable[source] = f"a call timed out after {timeout:g}s (a hang costs one timeout, not one per profile)"
                raise Contained("timeout", f"timed out after {timeout:g}s: {op} did not return; the worker was killed", _clock() - start)
            data = proc.conn.recv_bytes(MAX_REPLY_BYTES)
        except (EOFError, OSError):
            cause, why = proc.exit_reason()
            tail = proc.log_tail()
            self._discard()
            self._kill_strays(proc)
            raise Contained(cause, why + (f"\nworker log:\n{tail}" if tail else ""), _clock() - start) from None
        elapsed = _clock() - start
        try:
            reply = json.loads(data)
            if not isinstance(reply, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            self._discard()
            raise Contained("protocol", f"the worker sent a malformed reply ({exc}); was the socket written to by candidate code?", elapsed) from None
        left = self._kill_strays(proc)
        if left:
            raise Contained("process_left_running", f"{op} returned while {len(left)} process(es) it started were still running "
                                                    f"({left}); every process must finish before it returns", elapsed)
        return reply, elapsed

    def _worker_pids(self) -> set[int]:
        return {p.pid for p in self._live}

    def _kill_strays(self, proc: WorkerProcess) -> str:
        """Kill every process in the sandbox that is not a worker; describe them ('' when none)."""
        if not proc.zygote.alive():
            return ""
        strays = proc.zygote.strays(self._worker_pids())
        for p in strays:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return ", ".join(f"{p.name} [{p.ns_pid}]" for p in strays[:4]) + (f", +{len(strays) - 4} more" if len(strays) > 4 else "")

    def _observe(self, reply: dict, args: Sequence[Any], obs: CallObservation) -> None:
        try:
            if reply.get("error") is not None:
                obs.cause = str(reply.get("cause") or "exception")
                obs.error = f"{reply['error']}".rstrip() + f"\n[{obs.cause}] " + str(reply["error"]).strip().splitlines()[-1]
            if reply.get("returned") is not None:
                obs.returned = str(reply["returned"])[:200]
            worker_s = int(reply.get("worker_ns", -1)) / 1e9
            obs.worker_s = worker_s if 0 <= worker_s <= obs.elapsed_s else None
            meta = reply.get("meta") or [None] * len(args)
            obs.meta_after = [translate_meta(m, a, self._base_of) for m, a in zip(meta, args)]
            obs.retained = [int(i) for i in reply.get("retained", []) if 0 <= int(i) < len(args)]
            obs.aot_evidence = [str(r)[:80] for r in reply.get("aot_evidence", [])[:64]]
            obs.state_changed = self._state_changed(reply) if reply.get("global_state") else []
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise Contained("protocol", f"the worker sent a malformed observation ({exc!r})", obs.elapsed_s) from None

    def _state_changed(self, reply: dict) -> list[str]:
        """The worker's ``global_state`` report as one message; a worker whose state could not be put back is discarded."""
        changed = [str(c)[:300] for c in reply["global_state"][:32]]
        unrestored = [str(c)[:120] for c in (reply.get("global_state_unrestored") or [])[:32]]
        if unrestored:
            self._discard()
        return [state_changed_text(changed, [u + " (the worker was replaced)" for u in unrestored])]

    def _base_of(self, key: Any) -> int:
        """The referee's data pointer of the storage shared as ``key`` (0 when it is not one of ours)."""
        return self._shared[key].base_ptr if key in self._shared else 0

    def _settle(self, proc: WorkerProcess, args: Sequence[Any], obs: CallObservation) -> None:
        """Watch ``settle_s`` after the call: no argument may change, no thread may keep working."""
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        snaps = [a.detach().clone() for _, a in tensors]
        busy = Watch.busy_threads(proc, self.settle_s)
        for (i, a), snap in zip(tensors, snaps):
            if not bits_equal(a.detach(), snap):
                obs.cause = "late_write"
                obs.error = (f"argument {i} changed {self.settle_s * 1e3:g} ms after entry returned (a background thread or "
                             f"stream still writing?)\n[late_write] argument {i} was written after entry returned")
                return
        if busy:
            obs.cause, obs.error = "thread_left_running", f"{busy}\n[thread_left_running] {busy}"


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name))]
    return []
