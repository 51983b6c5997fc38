"""Child side of :class:`~kernelslot.isolation.worker.WorkerRunner`: the only processes that run candidate code.

The referee starts a *zygote* inside the sandbox (:mod:`kernelslot.isolation.sandbox`) as
``python -`` with a bootstrap on stdin that calls :func:`zygote`, so nothing in its command
line, ``__main__``, working directory (the private scratch) or environment names the referee.
The zygote confines itself (:func:`~kernelslot.isolation.sandbox.confine`), imports torch and
kernelslot, then only forks workers on request (no candidate code, no torch op, no thread ever
runs in it), so a fresh worker costs a fork, not an interpreter start. On its SOCK_SEQPACKET
socket the referee sends JSON requests: ``fork`` (the worker's socket and log file passed as
fds) answers ``{"pid"}`` (the pid inside the sandbox's PID namespace); ``wait`` answers the
worker's exit status (``{"code": n}``, negative = killed by signal ``-n``; ``None`` while it
still runs). The zygote is a child subreaper, so orphans of candidate processes stay in its
tree, where the referee finds them.

:func:`serve` runs in each worker: it moves into its own session, sends stdout/stderr to the
log, sets its resource limits (CPU time, file size, no core dumps; resident memory and process
count are enforced by the referee from outside), and answers requests on its socket: ``load``
imports the candidate, ``prepare``/``call`` run it. CPU tensors arrive as file descriptors
(``register`` entries of kind ``fd``, the descriptors sent right after the message). The
referee sends pickled requests (the worker trusts the referee); the worker answers in JSON
only, so nothing a candidate writes on the socket can run code in the referee.
"""
from __future__ import annotations

import time


def _call_entry(entry, args, _clock=time.perf_counter_ns):  # noqa: ANN001 - internal
    """Run ``entry(*args)``; return (result, traceback text or None, elapsed ns)."""
    start = _clock()
    try:
        result, err = entry(*args), None
    except BaseException:  # noqa: BLE001 - SystemExit from candidate code is contained too
        import traceback

        result, err = None, traceback.format_exc(limit=8)
    return result, err, _clock() - start


def _call_batch(entry, batch, _clock=time.perf_counter_ns):  # noqa: ANN001 - internal
    """``entry(*args)`` for each of ``batch`` back to back, stopping at the first that raises; return
    (results of the calls that returned, traceback text of the one that raised or None, elapsed ns
    of the whole loop). One clock span, not one per call: the two reads and the bookkeeping of a
    per-call span cost ~1 µs a call here, a share of a microsecond kernel's time the batch exists
    to keep small."""
    results = []
    start = _clock()
    try:
        for args in batch:
            results.append(entry(*args))
        err = None
    except BaseException:  # noqa: BLE001 - SystemExit from candidate code is contained too
        import traceback

        err = traceback.format_exc(limit=8)
    return results, err, _clock() - start


import contextlib  # noqa: E402
import faulthandler  # noqa: E402 - the clock above is bound first on purpose
import json  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402
from multiprocessing.connection import Connection  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from kernelslot.isolation import numeric_state  # noqa: E402
from kernelslot.isolation.observe import argument_meta, identity, short_repr  # noqa: E402
from kernelslot.isolation.scratch import poisoned_scratch  # noqa: E402

FDS_PER_MESSAGE = 200  # descriptors per SCM_RIGHTS message (the kernel takes at most 253)
_MEMORY_MARKERS = ("MemoryError", "not enough memory", "can't allocate memory", "std::bad_alloc", "out of memory")


def memory_error_text(text: str) -> bool:
    """True when a traceback says an allocation failed (the worker's memory cap or the device's)."""
    return any(m in text for m in _MEMORY_MARKERS)


class _ArgUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, worker: "_Worker"):
        import io

        super().__init__(io.BytesIO(data))
        self.worker = worker

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "t":
            _, key, offset, shape, stride, dtype = pid
            storage = self.worker.storages[key]
            view = torch.empty(0, dtype=getattr(torch, dtype), device=storage.device)
            return view.set_(storage, offset, shape, stride)
        if pid[0] == "p":
            if pid[1] not in self.worker.prepared:
                raise KeyError(f"prepared handle {pid[1]} is unknown to this worker (restarted since prepare?)")
            return self.worker.prepared[pid[1]]
        raise pickle.UnpicklingError(f"unknown persistent id {pid[0]!r}")


class _Worker:
    def __init__(self, fd_sock: socket.socket | None = None) -> None:
        self.fd_sock = fd_sock  # where descriptors of ``fd`` storages arrive
        self.storages: dict[int, torch.UntypedStorage] = {}
        self.prepared: dict[int, Any] = {}
        self.kernels: dict[Any, tuple[Any, Any]] = {}  # KernelSource -> (entry, prepare)
        self.state_changed: list[str] = []  # numeric state changed since the last prepare/call reply
        self.state_unrestored: list[str] = []
        self.staged: dict[str, Any] | None = None  # the batch between stage_batch and report_staged
        self.staged_guard: numeric_state.Guard | None = None  # the numeric-state guard spanning its run
        self.plans: dict[int, tuple] = {}  # served signatures: (kernel source, argument list over shared staging)

    # -- bookkeeping -------------------------------------------------------------------------
    def register(self, entries: list) -> None:
        wanted = sum(e[0] in ("fd", "fd_ro") for e in entries)
        fds: list[int] = []
        while len(fds) < wanted:  # in messages of at most FDS_PER_MESSAGE descriptors each
            _, got, _, _ = socket.recv_fds(self.fd_sock, 1, min(FDS_PER_MESSAGE, wanted - len(fds)))
            if not got:
                raise RuntimeError(f"expected {wanted} storage descriptors, received {len(fds)}")
            fds.extend(got)
        for entry in entries:
            kind, key = entry[0], entry[1]
            if kind == "fd":
                fd = fds.pop(0)
                try:
                    self.storages[key] = torch.UntypedStorage._new_shared_fd_cpu(fd, entry[2])
                finally:
                    os.close(fd)  # torch keeps its own duplicate
            elif kind == "fd_ro":  # a read-only descriptor: mapped PROT_READ, a write faults (isolation/executor.py)
                fd = fds.pop(0)
                try:
                    self.storages[key] = _read_only_storage(fd, entry[2])
                finally:
                    os.close(fd)
            elif kind == "cuda":
                _, _, rebuild, rebuild_args = entry
                self.storages[key] = rebuild(*rebuild_args).untyped_storage()
            elif kind == "empty":
                self.storages[key] = torch.UntypedStorage(0, device=entry[2])
            else:
                raise ValueError(f"unknown storage kind {kind!r}")

    def release(self, storages: list, prepared: list, plans: list = ()) -> None:
        for key in plans:
            self.plans.pop(key, None)
        for key in storages:
            self.storages.pop(key, None)
        for key in prepared:
            self.prepared.pop(key, None)

    def load(self, source: Any) -> tuple[Any, Any]:
        """The candidate's callables, loaded here exactly as the bundle loader would (once per source)."""
        if source not in self.kernels:
            from kernelslot.bundle.loader import resolve_callables

            self.kernels[source] = resolve_callables(source)
        return self.kernels[source]

    def locate(self, storage_ptr: int) -> int | None:
        for key, s in self.storages.items():
            if s.data_ptr() == storage_ptr:
                return key
        return None

    # -- requests ----------------------------------------------------------------------------
    def _close_staged_guard(self) -> None:
        """End the guard that spans a staged batch's run; what changed is reported with the next reply."""
        guard, self.staged_guard = self.staged_guard, None
        if guard is not None:
            guard.__exit__(None, None, None)
            self.state_changed += guard.changed
            self.state_unrestored += guard.unrestored

    def handle(self, msg: dict) -> dict:
        """One request, between a snapshot of the process-wide numeric state and a comparison: what
        candidate code changed (import included) is put back and reported with the next prepare or
        call reply (``global_state``; ``global_state_unrestored`` when something could not be put back).
        Served calls (``guard`` False: the doorbell) skip it: the worker's numeric state is its own, read
        from outside by the executor at audits (isolation/executor.py), and two snapshots cost ~0.25 ms.
        So does a timed batch's ``run_staged``: its snapshot is taken after staging and compared before
        the report, which carries what changed, so the two snapshots stay out of the timed step."""
        if msg["op"] not in ("run_staged", "load"):  # the batch's run is over (reported, or abandoned)
            self._close_staged_guard()
        if not msg.get("guard", True):
            return self._handle(msg)
        with numeric_state.Guard() as guard:
            reply = self._handle(msg)
        self.state_changed += guard.changed
        self.state_unrestored += guard.unrestored
        if msg["op"] == "stage_batch" and "error" not in reply:  # the timed run_staged is unguarded: this
            self.staged_guard = numeric_state.Guard().__enter__()  # one spans it, closed at the report
        if msg["op"] != "load" and self.state_changed:
            reply.update(global_state=self.state_changed, global_state_unrestored=self.state_unrestored)
            self.state_changed, self.state_unrestored = [], []
        return reply

    def _handle(self, msg: dict) -> dict:
        self.release(msg.get("release", []), msg.get("release_prepared", []), msg.get("release_plans", []))
        try:
            self.register(msg.get("register", []))
            entry, prepare = self.load(msg["kernel"])
            if msg["op"] == "load":
                return {}
            args = self.plans[msg["plan"]][1] if "plan" in msg else _ArgUnpickler(msg["args"], self).load()
        except BaseException:  # noqa: BLE001 - import-time failures of candidate code are reported
            text = traceback.format_exc(limit=8)
            return {"error": text, "cause": "out_of_memory" if memory_error_text(text) else "load_failed"}
        if msg["op"] == "prepare":
            return self.prepare(prepare, args, msg["handle"])
        if msg["op"] == "plan":  # a served signature's argument list, kept for doorbell calls
            self.plans[msg["handle"]] = (msg["kernel"], args)
            return {}
        if msg["op"] == "stage_batch":
            return self.stage_batch(entry, args, msg["check"])
        if msg["op"] == "run_staged":
            return self.run_staged()
        if msg["op"] == "report_staged":
            return self.report_staged()
        if msg.get("private"):
            return self.call_private(entry, args, msg["check"], bool(msg.get("scratch")))
        return self.call(entry, args, msg["check"], bool(msg.get("scratch")), observe=not msg.get("served"))

    def prepare(self, prepare: Any, args: tuple, handle: int) -> dict:
        if prepare is None:
            return {"error": "the slot needs prepare() but the kernel has none", "cause": "load_failed"}
        result, err, elapsed = _call_entry(prepare, args)
        if err is not None:
            return {"error": err, "cause": "out_of_memory" if memory_error_text(err) else "exception"}
        self.prepared[handle] = result
        return {"worker_ns": elapsed}

    def call_private(self, entry: Any, args: list, check: bool, scratch: bool = False) -> dict:
        """:meth:`call` on private (non-shared) copies of every shared tensor argument, each with the
        same storage size, offset and strides; the bytes are copied back into the shared storages after."""
        pairs = []  # (shared storage, private storage)
        private = list(args)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.untyped_storage().is_shared():
                mine = torch.UntypedStorage(a.untyped_storage().nbytes(), device=a.device)
                mine.copy_(a.untyped_storage())
                pairs.append((a.untyped_storage(), mine))
                private[i] = torch.empty(0, dtype=a.dtype, device=a.device).set_(mine, a.storage_offset(), a.shape, a.stride())
        reply = self.call(entry, private, check, scratch)
        for shared, mine in pairs:
            shared.copy_(mine)
        return reply

    # -- a timed batch in three requests: stage (untimed), run (timed by the referee), report (untimed) --
    def stage_batch(self, entry: Any, batch: list, check: bool) -> dict:
        """Hold ``batch``'s argument lists and their identities before anything runs."""
        tensors = [[(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)] for args in batch]
        self.staged = {"entry": entry, "batch": batch, "tensors": tensors, "check": check, "ran": ([], None, 0),
                       "cuda": any(t.is_cuda for ts in tensors for _, t in ts),
                       "before": [{i: identity(t) for i, t in ts} for ts in tensors],
                       "uses": [{i: torch._C._storage_Use_Count(t.untyped_storage()._cdata) for i, t in ts} if check else {}
                                for ts in tensors]}
        return {"staged": len(batch)}

    def run_staged(self) -> dict:
        """Every staged call back to back and nothing else; stops after a call that raises."""
        staged = self.staged
        if staged is None:
            return {"error": "run_staged without a staged batch", "cause": "protocol"}
        staged["ran"] = results, err, elapsed = _call_batch(staged["entry"], staged["batch"])
        if staged["cuda"]:
            torch.cuda.synchronize()
        return {"ran": len(results) + (err is not None)}  # nothing here costs more with more calls

    def report_staged(self) -> dict:
        """What each call of the batch that ran returned and left, as :meth:`call` reports it."""
        staged, self.staged = self.staged, None
        if staged is None:
            return {"error": "report_staged without a staged batch", "cause": "protocol"}
        results, error, elapsed = staged.pop("ran")
        # each call that ran is credited the loop's mean (the in-worker time is candidate-reported and
        # advisory: the referee's clock over the run's request is what counts)
        each = elapsed // max(1, len(results) + (error is not None))
        ran = [(r, None, each) for r in results] + ([(None, error, each)] if error is not None else [])
        del results
        calls = []
        for k, (result, err, elapsed) in enumerate(ran):
            args, tensors = staged["batch"][k], staged["tensors"][k]
            reply: dict[str, Any] = {"worker_ns": elapsed, "returned": None if result is None else short_repr(result)}
            del result
            if err is not None:
                reply.update(error=err, cause="out_of_memory" if memory_error_text(err) else "exception")
            reply["meta"] = argument_meta(len(args), tensors, staged["before"][k], self.locate, self.storages)
            if staged["check"]:
                uses = staged["uses"][k]
                reply["retained"] = [i for i, t in tensors if torch._C._storage_Use_Count(t.untyped_storage()._cdata) > uses[i]]
            calls.append(reply)
        if any(c.get("retained") for c in calls):  # a reference cycle may still hold a view: collect, then look again
            import gc

            gc.collect()
            for k, c in enumerate(calls):
                uses = staged["uses"][k]
                c["retained"] = [i for i, t in staged["tensors"][k]
                                 if torch._C._storage_Use_Count(t.untyped_storage()._cdata) > uses[i]]
        return {"calls": calls}

    def call(self, entry: Any, args: list, check: bool, scratch: bool = False, observe: bool = True) -> dict:
        """``entry(*args)``; ``scratch``: poison the allocators' freed memory right before (isolation/scratch.py);
        ``observe`` False (a served call: the executor's staging tensors are its own and it reads no
        ``meta``): what the arguments view afterwards is not reported."""
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        before = {i: identity(t) for i, t in tensors} if observe else {}
        uses = {i: torch._C._storage_Use_Count(t.untyped_storage()._cdata) for i, t in tensors} if check else {}
        with poisoned_scratch() if scratch else contextlib.nullcontext():
            result, err, elapsed = _call_entry(entry, args)
        reply: dict[str, Any] = {"worker_ns": elapsed, "returned": None if result is None else short_repr(result)}
        if hasattr(entry, "take_evidence"):  # a sealed direct artifact's launcher (bundle/direct/launcher.py)
            reply["aot_evidence"] = entry.take_evidence()
        del result
        if err is not None:
            reply.update(error=err, cause="out_of_memory" if memory_error_text(err) else "exception")
        if any(t.is_cuda for _, t in tensors):
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - an asynchronous device fault surfaces here
                text = traceback.format_exc(limit=4)
                reply.update(error=text, cause="out_of_memory" if memory_error_text(text) else "exception")
        if observe:
            reply["meta"] = argument_meta(len(args), tensors, before, self.locate, self.storages)
        if check:
            retained = [i for i, t in tensors if torch._C._storage_Use_Count(t.untyped_storage()._cdata) > uses[i]]
            if retained:
                import gc

                gc.collect()
                retained = [i for i, t in tensors if torch._C._storage_Use_Count(t.untyped_storage()._cdata) > uses[i]]
            reply["retained"] = retained
        return reply


def _set_limits(limits: dict) -> None:
    """CPU seconds and file size (``RLIMIT_CPU``, ``RLIMIT_FSIZE``; 0 = unlimited); no core dumps."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, rlimit in (("cpu_s", resource.RLIMIT_CPU), ("file_bytes", resource.RLIMIT_FSIZE)):
        value = int(limits.get(name) or 0)
        if value > 0:
            resource.setrlimit(rlimit, (value, value))


def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(sock: socket.socket, limits: dict, log_fd: int) -> None:
    """A worker's main loop (runs in the forked child); returns when the referee hangs up."""
    os.setsid()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    faulthandler.enable()
    _die_with_parent()
    _set_limits(limits)
    worker = _Worker(socket.socket(fileno=os.dup(sock.fileno())))
    conn = Connection(sock.detach())
    conn.send_bytes(json.dumps({"ready": os.getpid()}).encode())
    bell: _Doorbell | None = None  # set while the referee rings calls instead of sending them
    while True:
        if bell is None or not bell.active:
            try:
                msg = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                return
            if msg.get("op") == "doorbell":  # from now on calls come as rings, until the referee says stop
                bell = bell or _Doorbell(worker.fd_sock, worker.plans)
                bell.active = True
                conn.send_bytes(b"{}")
                continue
        else:
            msg = bell.wait()
            if msg is None:
                conn.send_bytes(b"{}")
                continue
        reply = worker.handle(msg)  # the same path as a socket request: the candidate sees one stack
        if bell is not None and bell.active:
            bell.answer(reply)
        else:
            conn.send_bytes(json.dumps(reply).encode())


class _Doorbell:
    """The worker's side of a served call path (isolation/executor.py): a shared control page and two
    eventfds. The referee writes a plan key and rings; the worker runs that plan's call as if it had
    come over the socket and writes its JSON reply into the page, then rings back."""

    HEADER = struct.Struct("<qqq")  # sequence number, plan key (-1: back to socket requests), reply length

    def __init__(self, fd_sock: socket.socket, plans: dict[int, tuple]) -> None:
        import mmap

        _, fds, _, _ = socket.recv_fds(fd_sock, 1, 3)
        if len(fds) != 3:
            raise RuntimeError(f"doorbell: expected 3 descriptors (page, ring, answer), received {len(fds)}")
        page, self.ring, self.done = fds
        self.page = mmap.mmap(page, os.fstat(page).st_size)
        os.close(page)
        self.active, self.plans = False, plans

    def wait(self) -> dict | None:
        os.eventfd_read(self.ring)
        seq, plan, _ = self.HEADER.unpack_from(self.page, 0)
        if plan < 0:
            self.active = False
            return None
        return {"op": "call", "kernel": self.plans[plan][0], "plan": plan, "check": False, "guard": False, "served": True}

    def answer(self, reply: dict) -> None:
        data = json.dumps(reply).encode()
        room = len(self.page) - self.HEADER.size
        if len(data) > room:
            data = json.dumps({"error": f"reply of {len(data)} bytes does not fit the doorbell page", "cause": "protocol"}).encode()
        self.page[self.HEADER.size:self.HEADER.size + len(data)] = data
        seq, plan, _ = self.HEADER.unpack_from(self.page, 0)
        self.HEADER.pack_into(self.page, 0, seq, plan, len(data))
        os.eventfd_write(self.done, 1)


def _read_only_storage(fd: int, nbytes: int) -> torch.UntypedStorage:
    """A CPU storage over ``nbytes`` of ``fd`` mapped read-only (a write to it is a SIGSEGV)."""
    import mmap
    import warnings

    view = mmap.mmap(fd, nbytes, prot=mmap.PROT_READ) if nbytes else b""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the given buffer is not writable": that is the point
        return torch.frombuffer(view, dtype=torch.uint8).untyped_storage() if nbytes else torch.UntypedStorage(0)


def zygote(fd: int, mode: str, scratch: str, visible: list[str]) -> None:
    """Fork workers for the referee until it hangs up (see the module docstring)."""
    from kernelslot.isolation.sandbox import confine

    confine(mode, scratch, visible)
    _die_with_parent()
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of candidate processes stay ours
        libc.prctl(4, 0)  # PR_SET_DUMPABLE 0: no process of the sandbox can open another's /proc/PID/mem
    except (OSError, AttributeError):
        pass
    sys.modules["__main__"] = types.ModuleType("__main__")  # the bootstrap names the referee; candidates see none of it
    sock = socket.socket(fileno=fd)
    sock.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        except OSError:
            return
        if not data:
            return
        req = json.loads(data)
        if req["op"] == "fork":
            pid = os.fork()
            if pid == 0:
                sock.close()
                code = 0
                try:
                    serve(socket.socket(fileno=fds[0]), dict(req["limits"]), fds[1])
                except BaseException:  # noqa: BLE001 - reported through the exit code and the log
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            for f in fds:
                os.close(f)
            sock.send(json.dumps({"pid": pid}).encode())
        elif req["op"] == "wait":
            sock.send(json.dumps({"code": _wait(int(req["pid"]), float(req["timeout"]))}).encode())


def _wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def bootstrap(fd: int, mode: str, scratch: str, visible: list[str]) -> str:
    """The program the referee writes to a zygote's stdin (``python -``)."""
    path = [p for p in sys.path if p]
    return (f"import sys\nsys.path[:0] = {path!r}\n"
            f"from kernelslot.isolation.child import zygote\nzygote({fd}, {mode!r}, {scratch!r}, {visible!r})\n")
