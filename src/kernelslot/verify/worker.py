"""``WorkerRunner``: candidate code runs in a separate worker process, never in the referee.

Contract (the runner boundary; docs/threat-model.md):

* The referee owns every tensor. :meth:`WorkerRunner.share` moves CPU storages into POSIX shared
  memory *in place* (same tensor objects, every view follows; data pointers then stay stable for
  the rest of the run), so the pipeline must call it before it snapshots inputs or records output
  identities. CUDA storages are handed over with CUDA IPC and need no preparation.
* The worker (forked by a zygote, ``python -m kernelslot.verify.worker_main``: a clean
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

import atexit
import dataclasses
import io
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef, reduce_tensor

from kernelslot.slots.base import Kernel, KernelSource
from kernelslot.verify.checks import bits_equal
from kernelslot.verify.runner import CallObservation, InProcessRunner, Runner, RunnerError, TensorMeta, judge_direct_evidence

__all__ = ["WorkerRunner", "PreparedHandle", "make_runner", "RESTART_CAUSES"]

_clock = time.perf_counter  # bound at import: candidate code never runs in this process anyway
MAX_REPLY_BYTES = 8 << 20
# Causes after which the worker is not trusted any more and is replaced.
RESTART_CAUSES = frozenset({"timeout", "crash", "exit", "out_of_memory", "thread_left_running", "late_write", "protocol"})


class PreparedHandle:
    """The referee's stand-in for a prepared object that lives in a worker."""

    def __init__(self, key: int, generation: int, kernel: str):
        self.key, self.generation, self.kernel = key, generation, kernel

    def __repr__(self) -> str:
        return f"PreparedHandle({self.kernel}, key={self.key}, worker={self.generation})"


class _Contained(Exception):
    def __init__(self, cause: str, message: str, elapsed_s: float = 0.0):
        super().__init__(message)
        self.cause, self.message, self.elapsed_s = cause, message, elapsed_s


@dataclasses.dataclass
class _Shared:
    ref: StorageWeakRef
    base_ptr: int
    entry: tuple  # registration message for a worker


class _Zygote:
    """The clean interpreter that forks workers (``python -m kernelslot.verify.worker_main``); one per referee."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen([sys.executable, "-m", "kernelslot.verify.worker_main", str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours

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

    def close(self) -> None:
        self.sock.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    @classmethod
    def shared(cls, start_timeout_s: float) -> "_Zygote":
        global _ZYGOTE
        if _ZYGOTE is None or _ZYGOTE.process.poll() is not None:
            z = cls()
            z.sock.settimeout(start_timeout_s)
            try:
                ready = z.sock.recv(1 << 16)
            except (socket.timeout, OSError):
                ready = b""
            if not ready:
                z.process.kill()
                raise RunnerError(f"the worker zygote did not start within {start_timeout_s:g}s (exit code {z.process.wait()}; "
                                  "its stderr is the referee's)")
            _ZYGOTE = z
            atexit.register(z.close)
        return _ZYGOTE


_ZYGOTE: _Zygote | None = None


class _Proc:
    """One worker process (forked by the zygote) and its socket."""

    def __init__(self, generation: int, memory_bytes: int, log_dir: str, start_timeout_s: float):
        self.generation = generation
        self.source: str | None = None  # the kernel file/module this worker is bound to
        self.registered: set[int] = set()
        self.prepared: set[int] = set()
        self.log_path = os.path.join(log_dir, f"worker-{generation}.log")
        self.exitcode: int | None = None
        self.zygote = _Zygote.shared(start_timeout_s)
        parent, child = socket.socketpair()
        try:
            self.pid = int(self.zygote.request({"op": "fork", "cap": memory_bytes, "log": self.log_path}, start_timeout_s,
                                               [child.fileno()])["pid"])
        finally:
            child.close()
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
            try:
                os.killpg(self.pid, signal.SIGKILL)  # its own session: the candidate's children too
            except (ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)  # not yet in its own session
            try:
                self.exitcode = self.zygote.request({"op": "wait", "pid": self.pid, "timeout": 10.0}, 20.0)["code"]
            except RunnerError:
                pass
        self.conn.close()

    def exit_reason(self) -> tuple[str, str]:
        if self.exitcode is None:
            self.exitcode = self.zygote.request({"op": "wait", "pid": self.pid, "timeout": 5.0}, 15.0)["code"]
        rc = self.exitcode
        if rc is None:
            self.kill()
            return "protocol", "the worker closed its socket but did not exit; it was killed"
        if rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else f"signal {-rc}"
            if -rc == signal.SIGKILL:
                return "crash", f"the worker was killed by {name} (out of memory? the kernel's OOM killer sends SIGKILL)"
            return "crash", f"the worker was killed by signal {name}"
        return "exit", f"the worker exited with code {rc} in the middle of the call (os._exit/sys.exit in candidate code?)"


class _ArgPickler(pickle.Pickler):
    def __init__(self, buf: io.BytesIO, runner: "WorkerRunner", proc: _Proc, register: list):
        super().__init__(buf, protocol=pickle.HIGHEST_PROTOCOL)
        self.runner, self.proc, self.register = runner, proc, register

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            key = self.runner._key_for(obj, self.proc, self.register)
            return ("t", key, obj.storage_offset(), tuple(obj.shape), tuple(obj.stride()), str(obj.dtype).removeprefix("torch."))
        if isinstance(obj, PreparedHandle):
            if obj.generation != self.proc.generation or obj.key not in self.proc.prepared:
                raise _Contained("load_failed", f"{obj!r} belongs to a worker that was replaced; prepare() again")
            return ("p", obj.key)
        return None


class WorkerRunner(Runner):
    """Runs candidates in a worker process with shared-memory tensors, deadlines and crash containment."""

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
    ):
        if call_timeout_s <= 0 or prepare_timeout_s <= 0:
            raise ValueError(f"WorkerRunner: timeouts must be positive (call {call_timeout_s}, prepare {prepare_timeout_s})")
        self.call_timeout_s, self.prepare_timeout_s, self.start_timeout_s = call_timeout_s, prepare_timeout_s, start_timeout_s
        self.memory_bytes = int(memory_limit_gib * (1 << 30)) if memory_limit_gib else 0
        self.settle_s, self.keep_spare = settle_s, keep_spare
        self._log_dir = tempfile.mkdtemp(prefix="kernelslot-worker-")
        self._generation = 0
        self._next_key = 0
        self._proc: _Proc | None = None
        self._spare: _Proc | None = None
        self._shared: dict[int, _Shared] = {}  # key -> storage
        self._key_of: dict[int, int] = {}  # StorageImpl address -> key
        self._dead_prepared: list[int] = []
        self._incumbent: WorkerRunner | None = None
        self.restarts = 0  # workers replaced after a contained failure
        self._live: list[_Proc] = []
        self._finalizer = weakref.finalize(self, WorkerRunner._cleanup, self._live, self._log_dir)

    # -- public API ------------------------------------------------------------------------------
    def share(self, obj: Any) -> Any:
        """Move every CPU tensor storage reachable in ``obj`` into shared memory, in place."""
        for t in _tensors(obj):
            if not t.is_cuda and t.untyped_storage().nbytes():
                self._share_cpu(t.untyped_storage())
        return obj

    def prepare(self, kernel: Kernel, prepare_args: Sequence[Any]) -> PreparedHandle:
        try:
            source = kernel.origin()
            if source.prepare is None:
                raise RunnerError(f"{kernel.name or source.entry}: the slot needs prepare() but the kernel has none")
            proc = self._worker_for(source)
            self._next_key += 1
            key = self._next_key
            reply, _ = self._request(proc, "prepare", source, tuple(prepare_args), self.prepare_timeout_s, handle=key)
        except _Contained as c:
            raise RunnerError(f"prepare() failed: {c.message}\n[{c.cause}]") from None
        except (ValueError, RunnerError) as exc:
            raise RunnerError(f"prepare() could not start: {exc}") from None
        if "error" in reply:
            if reply.get("cause") == "out_of_memory":
                self._discard()
            raise RunnerError(f"prepare() raised:\n{reply['error']}\n[{reply.get('cause', 'exception')}]")
        proc.prepared.add(key)
        handle = PreparedHandle(key, proc.generation, kernel.name or source.entry)
        weakref.finalize(handle, self._dead_prepared.append, key)
        return handle

    def call(self, kernel: Kernel, args: Sequence[Any], *, check_retention: bool = True) -> CallObservation:
        """Call ``entry`` in the worker. ``check_retention`` also enables the settle re-read."""
        obs = CallObservation()
        try:
            source = kernel.origin()
            proc = self._worker_for(source)
            reply, obs.elapsed_s = self._request(proc, "call", source, list(args), self.call_timeout_s, check=check_retention)
            self._observe(reply, args, obs)
            judge_direct_evidence(kernel, obs)
        except _Contained as c:
            obs.error, obs.cause, obs.elapsed_s = f"{c.message}\n[{c.cause}] {c.message.splitlines()[0]}", c.cause, c.elapsed_s
        except ValueError as exc:
            obs.error, obs.cause = f"[load_failed] {exc}", "load_failed"
        except RunnerError as exc:
            obs.error, obs.cause = f"[start_failed] {exc}", "start_failed"
        if obs.error is None and check_retention and self.settle_s > 0:
            self._settle(args, obs)
        if obs.cause in RESTART_CAUSES:
            self._discard()
        return obs

    def incumbent_runner(self) -> Runner:
        """A sibling runner (own worker) for the incumbent, so a candidate cannot slow it down."""
        if self._incumbent is None:
            self._incumbent = WorkerRunner(self.call_timeout_s, self.prepare_timeout_s, memory_limit_gib=None,
                                           settle_s=self.settle_s, start_timeout_s=self.start_timeout_s, keep_spare=False)
        return self._incumbent

    def close(self) -> None:
        self._proc = self._spare = None
        if self._incumbent is not None:
            self._incumbent.close()
        self._finalizer()

    def __enter__(self) -> "WorkerRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- workers ---------------------------------------------------------------------------------
    @staticmethod
    def _cleanup(live: list, log_dir: str) -> None:
        for proc in live:
            proc.kill()
        live.clear()
        shutil.rmtree(log_dir, ignore_errors=True)

    def _spawn(self) -> _Proc:
        self._generation += 1
        proc = _Proc(self._generation, self.memory_bytes, self._log_dir, self.start_timeout_s)
        self._live.append(proc)
        return proc

    def _discard(self, failed: bool = True) -> None:
        """Kill the current worker; ``failed`` counts it in ``restarts`` (not a switch of kernel source)."""
        if self._proc is not None:
            self._proc.kill()
            self._live.remove(self._proc)
            self._proc = None
            self.restarts += failed

    def _worker_for(self, source: KernelSource) -> _Proc:
        where = source.file or source.module or source.sealed or ""
        if self._proc is not None and self._proc.conn.poll(0):  # died or wrote between calls
            self._discard()
        if self._proc is not None and self._proc.source not in (None, where):
            self._discard(failed=False)
        if self._proc is None:
            proc, self._spare = (self._spare or self._spawn()), None
            self._await_ready(proc)
            self._proc = proc
            if self.keep_spare:
                self._spare = self._spawn()
        self._proc.source = where
        return self._proc

    def _await_ready(self, proc: _Proc) -> None:
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
    def _share_cpu(self, storage: torch.UntypedStorage) -> int:
        known = self._key_of.get(storage._cdata)
        if known is not None and not self._shared[known].ref.expired():
            return known
        try:
            manager, filename, nbytes = storage._share_filename_cpu_()
        except RuntimeError as exc:
            raise RunnerError(f"cannot move a CPU storage of {storage.nbytes()} bytes into shared memory ({exc}); "
                              "allocate the tensor with torch (not from_blob/numpy) so it can be shared") from None
        return self._remember(storage, ("cpu", manager, filename, nbytes))

    def _remember(self, storage: torch.UntypedStorage, entry: tuple) -> int:
        self._next_key += 1
        key = self._next_key
        self._shared[key] = _Shared(StorageWeakRef(storage), storage.data_ptr(), (entry[0], key, *entry[1:]))
        self._key_of[storage._cdata] = key
        return key

    def _key_for(self, t: torch.Tensor, proc: _Proc, register: list) -> int:
        if t.layout != torch.strided:
            raise _Contained("load_failed", f"cannot hand a {t.layout} tensor to the worker; only strided tensors are supported")
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
            register.append(self._shared[known].entry)
            proc.registered.add(known)
        return known

    def _released(self, proc: _Proc) -> list[int]:
        dead = [k for k, s in self._shared.items() if s.ref.expired()]
        for k in dead:
            self._key_of = {c: v for c, v in self._key_of.items() if v != k}
            del self._shared[k]
        gone = [k for k in dead if k in proc.registered]
        proc.registered.difference_update(gone)
        return gone

    # -- one request -----------------------------------------------------------------------------
    def _request(self, proc: _Proc, op: str, source: KernelSource, args: Any, timeout: float, **extra: Any) -> tuple[dict, float]:
        register: list = []
        buf = io.BytesIO()
        try:
            _ArgPickler(buf, self, proc, register).dump(args)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise _Contained("start_failed", f"cannot send the {op} arguments to the worker ({exc}); "
                                             "arguments must be tensors or picklable values") from None
        dead_prepared, self._dead_prepared = [k for k in self._dead_prepared if k in proc.prepared], []
        proc.prepared.difference_update(dead_prepared)
        msg = {"op": op, "kernel": source, "args": buf.getvalue(), "register": register,
               "release": self._released(proc), "release_prepared": dead_prepared, **extra}
        start = _clock()
        try:
            proc.conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
            if not proc.conn.poll(timeout):
                self._discard()
                raise _Contained("timeout", f"timed out after {timeout:g}s: {op} did not return; the worker was killed", _clock() - start)
            data = proc.conn.recv_bytes(MAX_REPLY_BYTES)
        except (EOFError, OSError):
            cause, why = proc.exit_reason()
            tail = proc.log_tail()
            self._discard()
            raise _Contained(cause, why + (f"\nworker log:\n{tail}" if tail else ""), _clock() - start) from None
        elapsed = _clock() - start
        try:
            reply = json.loads(data)
            if not isinstance(reply, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            self._discard()
            raise _Contained("protocol", f"the worker sent a malformed reply ({exc}); was the socket written to by candidate code?", elapsed) from None
        return reply, elapsed

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
            obs.meta_after = [self._translate(m, a) for m, a in zip(meta, args)]
            obs.retained = [int(i) for i in reply.get("retained", []) if 0 <= int(i) < len(args)]
            obs.receipts = [str(r)[:80] for r in reply.get("receipts", [])[:64]]
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise _Contained("protocol", f"the worker sent a malformed observation ({exc!r})", obs.elapsed_s) from None

    def _translate(self, meta: Any, arg: Any) -> TensorMeta | None:
        """Map the worker's view of an argument to referee addresses (0-based when not shared)."""
        if not isinstance(arg, torch.Tensor):
            return None
        if meta is None or meta == "same":  # None: the call never started (load failure)
            return TensorMeta.of(arg)
        key = meta["key"]
        base = self._shared[key].base_ptr if key in self._shared else 0
        return TensorMeta(base + int(meta["data_delta"]), base + int(meta["storage_delta"]), int(meta["nbytes"]),
                          tuple(int(s) for s in meta["shape"]), tuple(int(s) for s in meta["stride"]),
                          int(meta["offset"]), str(meta["dtype"]))

    def _settle(self, args: Sequence[Any], obs: CallObservation) -> None:
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        snaps = [a.detach().clone() for _, a in tensors]
        time.sleep(self.settle_s)
        for (i, a), snap in zip(tensors, snaps):
            if not bits_equal(a.detach(), snap):
                obs.cause = "late_write"
                obs.error = (f"argument {i} changed {self.settle_s * 1e3:g} ms after entry returned (a background thread or "
                             f"stream still writing?)\n[late_write] argument {i} was written after entry returned")
                return


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


def make_runner(isolate: bool, timeout_s: float = 30.0, *, device: str = "cpu", memory_limit_gib: float = 4.0) -> Runner:
    """The CLI's choice: ``WorkerRunner`` when ``isolate`` (the default for bundles), else in-process.

    On CUDA the address-space cap is off (the driver reserves far more address space than it
    uses); cap device memory with the operator's tooling instead (docs/threat-model.md).
    """
    if not isolate:
        return InProcessRunner()
    cap = None if torch.device(device).type == "cuda" else memory_limit_gib
    return WorkerRunner(call_timeout_s=timeout_s, prepare_timeout_s=max(4 * timeout_s, 60.0), memory_limit_gib=cap)
