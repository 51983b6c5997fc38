"""One rank of a local collective verification: the candidate's code and a minimal call loop, nothing else.

Run as ``python -m kernelslot.verify.collective.rank`` by the referee
(:mod:`kernelslot.verify.collective.session`), one process per rank, in its own session, connected
by an inherited Unix socket that speaks :mod:`kernelslot.isolation.wire` (JSON frames plus
file descriptors; never pickle). Global rank 0 hosts the process group's ``TCPStore`` on the
loopback of the rank's network namespace and sends ``{"op": "store", "port"}``; every other rank
gets that frame from the referee before it connects. The rank joins the default group and the
candidate's group, then answers frames:

* ``{"op": "job", "kernel", "storages", "prepare_args", "stall_after_s"}`` (storage fds attached):
  map the referee's shared storages, load the candidate with the bundle loader
  (:func:`kernelslot.bundle.loader.resolve_callables`, once per source) and run ``prepare`` when
  the job has prepare arguments; reply ``{"op": "prepared", "error", "cause"}``;
* ``{"op": "prepare", "seq", "args"}``: ``prepare`` again on the described arguments (the referee
  reloaded the weights in place: same storages, new values) and use its result from now on; reply
  ``{"op": "prepared", "seq", "error", "cause"}``;
* ``{"op": "call", "seq", "args", "storages", "graph", "private", "scratch"}``: call ``entry`` with
  the described arguments (the group in the GROUP position) and reply what was observed *where the
  call ran*: ``{"op": "called", "seq", "returned", "error", "cause", "meta", "retained", "worker_ns"}``.
  With ``private`` the candidate gets private, non-shared copies of every shared storage (same size,
  offset and strides), copied back whole into the shared storages after the call, so writes into
  the padding show as they do on shared tensors; with ``scratch`` the allocators' freed memory is
  poisoned right before the call (:func:`kernelslot.isolation.scratch.poisoned_scratch`).
  ``graph`` (CUDA only): ``"capture"`` captures the call in a CUDA graph (and replays it once),
  ``"replay"`` replays the captured graph;
* ``{"op": "release", "seq", "keys"}`` drops storages and ends the job (reply ``{"op": "released",
  "seq"}``); ``{"op": "stop"}`` ends the process.

No check is made here and no reference or comparator is ever here: the referee refills the
inputs, poisons the outputs and checks everything from shared memory itself, so a candidate that
patches this module, or writes its own frames on the socket, changes at most what an observation
claims (its identity report, its return value, its numeric-state report), never what the referee
reads from the tensors. The process-wide numeric state is snapshotted around every load, prepare
and call (:class:`kernelslot.isolation.numeric_state.Guard`); what candidate code changed is put
back and reported in that reply (``global_state``, and ``global_state_unrestored`` for what could
not be put back). The referee also reads every rank thread's floating-point control state from
outside (:mod:`kernelslot.isolation.fpcontrol`), which a candidate here cannot patch.
A watchdog thread sends ``{"op": "stalled", "seq", "stack"}`` (the main thread's stack) when a
call overruns ``stall_after_s``, so a hang is attributed to the rank whose code is stuck.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from kernelslot.isolation import numeric_state
from kernelslot.isolation.observe import argument_meta, identity, short_repr
from kernelslot.isolation.scratch import poisoned_scratch
from kernelslot.isolation.wire import WireError, map_storage, recv_frame, send_frame

__all__ = ["init_rank", "forbid_group_creation", "main"]

_clock = time.perf_counter_ns


def _private_copies(args: list[Any]) -> tuple[list[Any], list[tuple[torch.UntypedStorage, torch.UntypedStorage]]]:
    """``args`` with every tensor moved onto a private (non-shared) copy of its storage: same storage
    size, offset, shape and strides, one copy per storage (views of one storage stay views of one);
    and the (shared, private) storage pairs to copy back after the call."""
    pairs: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
    out = []
    for a in args:
        if not isinstance(a, torch.Tensor):
            out.append(a)
            continue
        shared = a.untyped_storage()
        if shared._cdata not in pairs:
            mine = torch.UntypedStorage(shared.nbytes(), device=shared.device)
            mine.copy_(shared)
            pairs[shared._cdata] = (shared, mine)
        out.append(torch.empty(0, dtype=a.dtype, device=a.device).set_(pairs[shared._cdata][1], a.storage_offset(),
                                                                        a.shape, a.stride()))
    return out, list(pairs.values())


def _with_state(reply: dict, guard: numeric_state.Guard) -> dict:
    """``reply`` with what candidate code changed in the process-wide numeric state (put back where it could be)."""
    if guard.changed:
        reply.update(global_state=guard.changed, global_state_unrestored=guard.unrestored)
    return reply


def _use_count(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _Watchdog:
    """Sends the main thread's stack once if a call overruns."""

    def __init__(self, report: Callable[[str], None], after_s: float):
        self._report, self._after = report, after_s
        self._main = threading.main_thread().ident
        self._timer: threading.Timer | None = None

    def __enter__(self) -> "_Watchdog":
        self._timer = threading.Timer(self._after, self._fire)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._timer is not None
        self._timer.cancel()

    def _fire(self) -> None:
        frame = sys._current_frames().get(self._main)
        self._report("".join(traceback.format_stack(frame)) if frame is not None else "")


class _Rank:
    """The call loop's state: mapped storages, loaded kernels, the current job's prepared object."""

    def __init__(self, sock: socket.socket, group: Any, device: torch.device):
        self.sock, self.group, self.device = sock, group, device
        self.lock = threading.Lock()
        self.storages: dict[int, torch.UntypedStorage] = {}
        self.kernels: dict[tuple, tuple[Callable, Callable | None]] = {}
        self.entry: Callable | None = None
        self.prepare_fn: Callable | None = None
        self.prepared: Any = None
        self.stall_after_s = 30.0
        self.graph: Any = None

    def send(self, obj: dict) -> None:
        with self.lock:
            send_frame(self.sock, obj)

    def register(self, entries: list, fds: list[int]) -> None:
        cpu_fds = iter(fds)  # one descriptor per CPU storage, in order
        for entry in entries:
            fd = next(cpu_fds, None) if entry["kind"] == "cpu" else None
            if entry["kind"] == "cpu" and fd is None:
                raise WireError("a CPU storage arrived without its file descriptor")
            self.storages[int(entry["key"])] = map_storage(entry, fd, self.device)

    def value(self, desc: dict) -> Any:
        if "t" in desc:
            storage = self.storages[int(desc["t"])]
            view = torch.empty(0, dtype=getattr(torch, desc["dtype"]), device=storage.device)
            return view.set_(storage, int(desc["offset"]), tuple(desc["shape"]), tuple(desc["stride"]))
        if desc.get("prepared"):
            return self.prepared
        if desc.get("group"):
            return self.group
        if "none" in desc:
            return None
        return desc["v"]

    def locate(self, storage_ptr: int) -> int | None:
        return next((k for k, s in self.storages.items() if s.data_ptr() == storage_ptr), None)

    # -- requests ----------------------------------------------------------------------------
    def job(self, msg: dict, fds: list[int]) -> dict:
        """Map the job's storages, load the candidate and prepare; import and prepare inside one numeric-state guard."""
        self.entry = self.prepare_fn = self.prepared = self.graph = None
        self.stall_after_s = float(msg["stall_after_s"])
        with numeric_state.Guard() as guard:
            reply = self._load_and_prepare(msg, fds)
        return _with_state(reply, guard)

    def _load_and_prepare(self, msg: dict, fds: list[int]) -> dict:
        try:
            self.register(msg.get("storages", []), fds)
            src = msg["kernel"]
            key = (src["entry"], src.get("prepare"), src.get("file"), src.get("module"))
            if key not in self.kernels:
                from kernelslot.bundle.loader import resolve_callables
                from kernelslot.slots.base import KernelSource

                self.kernels[key] = resolve_callables(KernelSource(*key))
            self.entry, self.prepare_fn = self.kernels[key]
        except BaseException:  # noqa: BLE001 - import-time failures of candidate code are reported
            return {"op": "prepared", "error": traceback.format_exc(limit=6), "cause": "load_failed"}
        if msg.get("prepare_args") is None:
            return {"op": "prepared", "error": None}
        return self._prepare(msg["prepare_args"], int(msg["seq"]))

    def prepare_again(self, msg: dict) -> dict:
        """``prepare`` once more on the job's weights, which the referee reloaded in place; the call uses its result."""
        seq = int(msg["seq"])
        with numeric_state.Guard() as guard:
            reply = self._prepare(msg["args"], seq)
        return {**_with_state(reply, guard), "seq": seq}

    def _prepare(self, descs: list[dict], seq: int) -> dict:
        if self.prepare_fn is None:
            return {"op": "prepared", "error": "the slot needs prepare() but the kernel has none", "cause": "load_failed"}
        args = [self.value(d) for d in descs]
        try:
            with _Watchdog(self._stalled(seq), self.stall_after_s):
                self.prepared = self.prepare_fn(*args)
        except BaseException:  # noqa: BLE001 - SystemExit from candidate code is contained too
            return {"op": "prepared", "error": traceback.format_exc(limit=8), "cause": "exception"}
        return {"op": "prepared", "error": None}

    def _stalled(self, seq: int) -> Callable[[str], None]:
        return lambda stack: self.send({"op": "stalled", "seq": seq, "stack": stack})

    def call(self, msg: dict, fds: list[int]) -> dict:
        seq = int(msg["seq"])
        self.register(msg.get("storages", []), fds)
        shared = [self.value(d) for d in msg["args"]]
        # private: the candidate gets private, non-shared copies, copied back whole after the call
        args, pairs = _private_copies(shared) if msg.get("private") else (shared, [])
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        before = {i: identity(t) for i, t in tensors}
        uses = {i: _use_count(t) for i, t in tensors}
        reply: dict[str, Any] = {"op": "called", "seq": seq, "returned": None, "error": None}
        with numeric_state.Guard() as guard:
            start = _clock()
            try:
                with _Watchdog(self._stalled(seq), self.stall_after_s), \
                        poisoned_scratch() if msg.get("scratch") else contextlib.nullcontext():
                    result = self._run(args, msg.get("graph"))
                if result is not None:
                    reply["returned"] = short_repr(result)
                del result
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            except BaseException:  # noqa: BLE001 - SystemExit from candidate code is contained too
                reply.update(error=traceback.format_exc(limit=8), cause="exception")
            reply["worker_ns"] = _clock() - start
        _with_state(reply, guard)
        reply["meta"] = argument_meta(len(args), tensors, before, self.locate, self.storages)
        for storage, private in pairs:
            storage.copy_(private)  # the referee judges the shared storages (inputs and padding too: a write shows)
        del args, shared  # ``pairs`` stays: its storages were counted in ``uses``
        retained = [i for i, t in tensors if _use_count(t) > uses[i]]
        if retained:  # a reference cycle may still hold a view: collect, then look again
            gc.collect()
            retained = [i for i, t in tensors if _use_count(t) > uses[i]]
        reply["retained"] = retained
        return reply

    def _run(self, args: list, graph: str | None) -> Any:
        assert self.entry is not None
        if graph is None:
            return self.entry(*args)
        if graph == "capture":  # CUDA only: NCCL collectives are capturable on the capturing stream
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self.entry(*args)  # warm-up outside the capture (NCCL communicator set-up, lazy init)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                result = self.entry(*args)
            self.graph.replay()
            return result
        if self.graph is None:
            raise RuntimeError("graph replay requested before a capture")
        self.graph.replay()
        return None

    def release(self, msg: dict) -> dict:
        """Drop storages; the reply closes the job, so a stray frame written by the candidate shows up now."""
        for key in msg.get("keys", []):
            self.storages.pop(int(key), None)
        self.entry = self.prepare_fn = self.prepared = self.graph = None
        return {"op": "released", "seq": int(msg["seq"])}


def init_rank(rank: int, world: int, group_ranks: list[int], backend: str, store: dist.Store | None,
              timeout_s: float) -> Any:
    """Join the default group and make the candidate's group over ``group_ranks`` via ``new_group``.

    Every process of the world takes part in ``new_group`` (ranks outside it get a non-member
    handle); the candidate only ever sees the new group. Afterwards group creation is disabled
    in this process (:func:`forbid_group_creation`).
    """
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    else:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    group = dist.new_group(ranks=group_ranks, timeout=timeout)
    forbid_group_creation()
    return group


_GROUP_MAKERS = ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration")


def forbid_group_creation() -> None:
    """Make the public group constructors raise: a collective candidate must use the group it is given."""
    from torch.distributed import distributed_c10d

    def forbidden(name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"torch.distributed.{name}() called by the candidate: collective slots must use the "
                               "supplied group, never create process groups of their own")
        return refuse

    for name in _GROUP_MAKERS:
        for module in (dist, distributed_c10d):
            if hasattr(module, name):
                setattr(module, name, forbidden(name))


def _join_store(sock: socket.socket, rank: int, world: int, timeout_s: float) -> dist.Store:
    """Global rank 0 hosts the group's store on this network namespace's loopback and tells the
    referee its port (``{"op": "store", "port"}``); every other rank waits for that frame, then connects."""
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=timeout)
        send_frame(sock, {"op": "store", "port": store.port})
        return store
    msg, _ = recv_frame(sock)
    if msg.get("op") != "store":
        raise WireError(f"expected the store's port, got op {msg.get('op')!r}")
    return dist.TCPStore("127.0.0.1", int(msg["port"]), world, is_master=False, timeout=timeout)


def _serve(sock: socket.socket, rank: int, world: int, spare: bool, backend: str, device_kind: str,
           timeout_s: float) -> None:
    device = torch.device("cpu")
    if device_kind == "cuda":  # group rank r on GPU r (mod the count); the spare shares GPU 0
        member = rank - 1 if spare and rank > 0 else rank
        device = torch.device("cuda", member % torch.cuda.device_count())
        torch.cuda.set_device(device)
    store = _join_store(sock, rank, world, timeout_s)
    group = init_rank(rank, world, list(range(1 if spare else 0, world)), backend, store, timeout_s)
    state = _Rank(sock, group, device)
    state.send({"op": "ready", "pid": os.getpid()})
    while True:
        msg, fds = recv_frame(sock, with_fds=True)
        op = msg.get("op")
        if op == "stop":
            return
        if op == "job":
            state.send({**state.job(msg, fds), "seq": msg.get("seq")})
        elif op == "prepare":
            state.send(state.prepare_again(msg))
        elif op == "call":
            state.send(state.call(msg, fds))
        elif op == "release":
            state.send(state.release(msg))
        else:
            raise WireError(f"unknown op {op!r}")


def _exit_with_parent(parent: int) -> None:
    """Leave when the referee dies, even while the candidate's code is stuck (no orphaned ranks)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one rank of a local collective verification (spawned by the referee)")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--spare", action="store_true", help="global rank 0 stays out of the candidate's group")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--sandbox", default="none", help="the sandbox mode this process was started in")
    parser.add_argument("--scratch", default="", help="its private scratch directory")
    a = parser.parse_args(argv)
    from kernelslot.isolation.sandbox import confine

    confine(a.sandbox, a.scratch)  # before any candidate code: finish what the launcher could not
    sock = socket.socket(fileno=a.fd)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    code = 0
    try:
        _serve(sock, a.rank, a.world, a.spare, a.backend, a.device, a.timeout)
    except WireError as exc:
        if not exc.eof:  # the referee went away: nothing left to report to
            traceback.print_exc()
            code = 1
    except BaseException:  # noqa: BLE001 - a candidate's sys.exit included; the referee reads the log
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip process-group teardown: peers may be dead or stuck


if __name__ == "__main__":
    main()
