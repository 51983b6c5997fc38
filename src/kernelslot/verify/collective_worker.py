"""One rank of a collective verification: load the candidate, run its calls, make the ABI checks.

A rank receives a :class:`RankJob` (its own inputs for every call, its prepare arguments, the
output specs and a :class:`KernelRef`), and for each call: refills the live inputs in place with
the call's values, poisons the outputs, calls ``entry`` with the supplied ``group`` through
:class:`~kernelslot.verify.runner.InProcessRunner`, and makes the per-call checks of
:mod:`kernelslot.verify.checks` *where the call ran* (input mutation, returned value, storage
swaps, aliasing, poison left, canary, retention). It sends back plain data: the failed checks
and a CPU copy of every output. It never sees a reference or a comparator; the referee compares.

A watchdog thread reports where the rank is stuck (its main thread's Python stack) when a call
overruns ``stall_after_s``, so a hang is attributed to the rank whose code is stuck.

Run as ``python -m kernelslot.verify.collective_worker`` by :mod:`kernelslot.verify.collective`
(the local spawner): one process per rank, connected to the referee by an inherited socket.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pickle
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, Callable

import torch
import torch.distributed as dist

from kernelslot.abi import OutputSpec, Role, allocate_output
from kernelslot.slots.base import Kernel
from kernelslot.verify.checks import check_call, check_inputs, snapshot
from kernelslot.verify.pipeline import _CALL_CHECKS, tensors_in, to_device
from kernelslot.verify.report import ProfileResult
from kernelslot.verify.runner import InProcessRunner, RunnerError, TensorMeta

__all__ = ["KernelRef", "RankJob", "CallReport", "load_kernel", "run_job", "stuck_where", "send_obj", "recv_obj"]


def send_obj(conn: Connection, obj: Any) -> None:
    """Send with plain pickle: tensors travel by value (multiprocessing's pickler would share them by fd)."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def recv_obj(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


@dataclass(frozen=True)
class KernelRef:
    """How a rank imports the candidate: ``"package.module:qualname"`` or ``"/path/file.py:qualname"``."""

    entry: str
    prepare: str | None = None
    name: str = ""


@dataclass
class RankJob:
    """One profile × seed as one rank sees it."""

    label: str  # profile label, for messages
    kernel: KernelRef
    args: list[tuple[str, str]]  # the slot's (name, role) in call order
    calls: list[dict[str, Any]]  # this rank's inputs for call 0, 1, ... (replays)
    live: tuple[str, ...]  # inputs refreshed in place on replays
    prepare_args: tuple
    outputs: dict[str, OutputSpec]
    stall_after_s: float


@dataclass
class CallReport:
    """What a rank observed for one call (``call = -1``: load or prepare)."""

    rank: int
    call: int
    failures: list[tuple[str, str]] = field(default_factory=list)  # (check name, message)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # CPU copies, only when comparable
    performed: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


def _resolve(ref: str) -> Callable[..., Any]:
    target, _, qualname = ref.rpartition(":")
    if not target or not qualname:
        raise ValueError(f"kernel reference {ref!r}: expected 'module:qualname' or '/path/file.py:qualname'")
    if target.endswith(".py"):
        name = "kernelslot_candidate_" + format(abs(hash(os.path.abspath(target))), "x")
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, target)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load candidate source {target}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def load_kernel(ref: KernelRef) -> Kernel:
    """Import the candidate's entry (and prepare) in this process."""
    return Kernel(_resolve(ref.entry), _resolve(ref.prepare) if ref.prepare else None, ref.name or ref.entry)


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


class _Watchdog:
    """Reports the main thread's stack once if a call overruns."""

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


def _args(job: RankJob, inputs: dict[str, Any], outputs: dict, prepared: Any, group: Any) -> list[Any]:
    values = []
    for name, role in job.args:
        if role in (Role.INPUT.value, Role.SCALAR.value):
            values.append(inputs[name])
        elif role == Role.OUTPUT.value:
            values.append(outputs[name].view if name in outputs else None)
        elif role == Role.PREPARED.value:
            values.append(prepared)
        else:
            values.append(group)
    return values


def run_job(job: RankJob, rank: int, group: Any, device: torch.device, send: Callable[[Any], None],
            kernels: dict[KernelRef, Kernel]) -> bool:
    """Run every call of ``job`` on this rank, sending one :class:`CallReport` per call.

    ``send`` also receives ``("stalled", rank, call, stack)`` from the watchdog. A call whose checks
    failed but which returned keeps the ranks in step, so the remaining calls still run; the job
    stops (returns False) after a load/prepare failure or a call that raised.
    """
    head = CallReport(rank, -1)
    try:
        kernel = kernels.get(job.kernel) or kernels.setdefault(job.kernel, load_kernel(job.kernel))
    except Exception:
        head.failures.append(("raised", f"could not load the candidate {job.kernel.entry}:\n" + traceback.format_exc(limit=4)))
        send(head)
        return False
    runner = InProcessRunner()
    inputs = to_device(job.calls[0], device)
    prepare_args = to_device(job.prepare_args, device)
    prep_snap = snapshot(tensors_in(prepare_args))
    prepared = None

    def stall(call: int) -> Callable[[str], None]:
        return lambda stack: send(("stalled", rank, call, stack))

    if any(role == Role.PREPARED.value for _, role in job.args):
        try:
            with _Watchdog(stall(-1), job.stall_after_s):
                prepared = runner.prepare(kernel, prepare_args)
        except RunnerError as exc:
            head.failures.append(("prepare", str(exc)))
            send(head)
            return False
        scratch = ProfileResult("", job.label, "", "", 0, kernel.name)
        if not check_inputs(scratch, tensors_in(prepare_args), prep_snap, "prepare(): "):
            head.failures += [(c.name, c.message) for c in scratch.failures()]
            send(head)
            return False
        head.performed.append("prepare")
    send(head)
    outputs = {n: allocate_output(spec, device) for n, spec in job.outputs.items() if spec is not None}
    values = _args(job, inputs, outputs, prepared, group)
    names = [n for n, _ in job.args]
    for call, fresh in enumerate(job.calls):
        label = f"replay {call}: " if call else ""
        if call:
            for name in job.live:
                inputs[name].copy_(fresh[name])  # same storage, fresh values
        in_snap = snapshot(inputs)
        for alloc in outputs.values():
            alloc.poison(finite=call == 1)  # as the pipeline: the first replay uses a finite sentinel, the others NaN
        out_meta = {n: TensorMeta.of(a.view) for n, a in outputs.items()}
        with _Watchdog(stall(call), job.stall_after_s):
            obs = runner.call(kernel, values)
        scratch = ProfileResult("", job.label, "", "", 0, kernel.name)
        check_inputs(scratch, inputs, in_snap, label)
        check_inputs(scratch, tensors_in(prepare_args), prep_snap, label + "weights: ")
        usable = check_call(scratch, obs, names, list(outputs), outputs, out_meta,
                            {k: m for k, (_, m) in in_snap.items()}, label)
        report = CallReport(rank, call, [(c.name, c.message) for c in scratch.failures()], performed=list(_CALL_CHECKS),
                            elapsed_s=obs.elapsed_s)
        if usable:
            report.outputs = {n: a.view.detach().cpu().clone() for n, a in outputs.items()}
        send(report)
        if obs.error:  # peers may now wait for this rank in a collective: the referee ends the session
            return False
    return True


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


def _serve(conn: Connection, rank: int, world: int, spare: bool, backend: str, device_kind: str,
           store_port: int, timeout_s: float) -> None:
    lock = threading.Lock()

    def send(msg: Any) -> None:
        with lock:
            send_obj(conn, msg)

    device = torch.device("cpu")
    if device_kind == "cuda":  # group rank r on GPU r (mod the count); the spare shares GPU 0
        member = rank - 1 if spare and rank > 0 else rank
        device = torch.device("cuda", member % torch.cuda.device_count())
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", store_port, world, is_master=False, timeout=timedelta(seconds=timeout_s))
    group = init_rank(rank, world, list(range(1 if spare else 0, world)), backend, store, timeout_s)
    send(("ready", rank, os.getpid()))
    kernels: dict[KernelRef, Kernel] = {}
    while True:
        msg = recv_obj(conn)
        if msg == "stop":
            return
        if spare and rank == 0:  # the spare rank: in the world, never in the candidate's group
            continue
        run_job(msg, dist.get_rank(group), group, device, send, kernels)


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
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    a = parser.parse_args(argv)
    conn = Connection(a.fd)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    code = 0
    try:
        _serve(conn, a.rank, a.world, a.spare, a.backend, a.device, a.store_port, a.timeout)
    except (EOFError, BrokenPipeError):
        pass  # the referee went away: nothing left to report to
    except BaseException:  # noqa: BLE001 - a candidate's sys.exit included; the referee reads stderr
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip process-group teardown: peers may be dead or stuck


if __name__ == "__main__":
    # run from the importable module, so that pickled reports name kernelslot.verify.collective_worker classes
    from kernelslot.verify.collective_worker import main as _main

    _main()
