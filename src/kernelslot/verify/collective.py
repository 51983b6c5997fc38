"""The collective referee: verify a collective slot across real processes with torch.distributed.

Local mode (:func:`verify_collective`, used by ``verify_slot`` for every ``SlotKind.COLLECTIVE``
slot): for a group of ``W`` ranks the referee spawns ``W + 1`` worker processes (each in its own
session, so a whole process tree can be killed), joined through a ``TCPStore`` the referee hosts
on a free localhost port (gloo on CPU, NCCL on CUDA). Every process calls ``dist.new_group(1..W)``
and the candidate receives that group, never the default one. Global rank 0 is a *spare*: in the
default world group, outside the candidate's group, it never calls a collective. So a candidate
that reduces over the default group never completes and is caught by the deadline (with every
rank reported blocked inside torch.distributed); group rank ``r`` is global rank ``r + 1``, so
confusing the two is wrong too; and the group constructors (``new_group``, ...) raise inside the
rank processes once the referee's group exists.

Per profile × seed the referee builds every rank's inputs (``Case.meta["per_rank"]``), computes the
trusted reference for each call here, sends each rank only its own share, and receives plain data
(:class:`~kernelslot.verify.collective_worker.CallReport`). Each rank poisons its outputs before
every call, uses padded strides, and makes the ABI checks where the call ran; the referee compares
*every* rank's outputs with the reference and replays with fresh inputs. A rank that raises, exits
or gives no result within ``collective_timeout_s`` (per call) fails the profile with its rank and
the reason (for a hang: where its Python stack was stuck); the processes are then killed and the
next profile gets a fresh set. Results are :class:`~kernelslot.verify.report.ProfileResult`.

torchrun mode (:func:`main` with ``RANK``/``WORLD_SIZE`` in the environment): see docs/collectives.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from kernelslot.abi import SlotKind
from kernelslot.slots.base import Candidate, Case, Kernel, Profile, SlotDef, dtype_name
from kernelslot.slots.collective import rank_shares, world_of
from kernelslot.verify.collective_worker import CallReport, KernelRef, RankJob, recv_obj, send_obj, stuck_where
from kernelslot.verify.pipeline import VerifyOptions, clone_case, describe, make_case, refilled, select_profiles
from kernelslot.verify.report import CHECKS, FAIL, PASS, SKIP, ProfileResult, SlotReport

__all__ = ["verify_collective", "kernel_ref", "CollectiveSession", "SessionError", "main"]

Progress = Callable[[ProfileResult], None]
_STARTUP_S = 120.0  # import torch + rendezvous on a loaded machine
_STALL_FRACTION = 0.75  # a rank reports its stack after this fraction of the deadline
_STOP_GRACE_S = 1.0  # after one rank stopped, how long its peers get to finish or stop before a respawn


def _callable_ref(fn: Any, what: str) -> str:
    if isinstance(fn, str):
        return fn
    qual = getattr(fn, "__qualname__", "")
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if not qual or "<locals>" in qual or "<lambda>" in qual or module is None:
        raise ValueError(f"{what} {fn!r} is not importable by name: collective candidates are loaded by every rank "
                         "from 'module:qualname' or '/path/file.py:qualname'; define it at module level")
    name, file = module.__name__, getattr(module, "__file__", None)
    spec = importlib.util.find_spec(name) if name != "__main__" else None
    if spec is not None and file and spec.origin and os.path.samefile(spec.origin, file):
        return f"{name}:{qual}"
    if file:
        return f"{os.path.abspath(file)}:{qual}"
    raise ValueError(f"{what} {fn!r}: its module {name} has no source file to load in the rank processes")


def kernel_ref(kernel: Kernel) -> KernelRef:
    """How the rank processes import ``kernel`` (its entry/prepare may also be given as reference strings)."""
    prepare = _callable_ref(kernel.prepare, "prepare") if kernel.prepare is not None else None
    return KernelRef(_callable_ref(kernel.entry, "entry"), prepare, kernel.name)


class SessionError(RuntimeError):
    """The rank processes could not be started or joined (the message names the rank)."""


def _tail(path: str, lines: int = 6) -> str:
    try:
        with open(path, errors="replace") as fh:
            text = fh.read().strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


class CollectiveSession:
    """One spare rank (global rank 0) plus ``group_size`` candidate ranks (global 1..W), ready to run jobs.

    The candidate's group rank ``r`` is global rank ``r + 1``, so a candidate that confuses the two
    (or assumes its group is the world) computes the wrong thing. Always :meth:`close` a session.
    """

    def __init__(self, group_size: int, device: str = "cpu", timeout_s: float = 30.0):
        self.group_size, self.device, self.timeout_s = group_size, device, timeout_s
        self.world = group_size + 1
        self.backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        self.broken = False
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        self.logs: list[str] = []
        self._logdir = tempfile.mkdtemp(prefix="kernelslot-collective-")
        self._store = dist.TCPStore("127.0.0.1", 0, self.world, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=_STARTUP_S))
        try:
            self._spawn()
        except BaseException:
            self.close()
            raise

    def _spawn(self) -> None:
        # gloo gives up on a stuck peer only well after the referee's own deadline has fired
        pg_timeout = 3 * self.timeout_s + 30
        for rank in range(self.world):
            parent, child = socket.socketpair()
            log = os.path.join(self._logdir, f"rank{rank}.log")
            cmd = [sys.executable, "-m", "kernelslot.verify.collective_worker", "--fd", str(child.fileno()),
                   "--rank", str(rank), "--world", str(self.world), "--spare",
                   "--backend", self.backend, "--device", self.device, "--store-port", str(self._store.port),
                   "--timeout", str(pg_timeout)]
            with open(log, "wb") as fh:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, pass_fds=(child.fileno(),),
                                        start_new_session=True, env=self._child_env())
            child.close()
            self.procs.append(proc)
            self.conns.append(Connection(parent.detach()))
            self.logs.append(log)
        waiting = set(range(self.world))
        deadline = time.monotonic() + _STARTUP_S
        while waiting:
            ready = wait([self.conns[r] for r in waiting], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise SessionError(f"{self._name(min(waiting))}: did not join the process group within {_STARTUP_S:.0f} s")
            for conn in ready:
                rank = self.conns.index(conn)
                try:
                    msg = recv_obj(conn)
                except EOFError:
                    raise SessionError(f"{self._name(rank)}: exited while starting (code {self.procs[rank].wait()}): "
                                       f"{_tail(self.logs[rank])}") from None
                if msg[0] == "ready":
                    waiting.discard(rank)

    @staticmethod
    def _child_env() -> dict[str, str]:
        """The referee's import path (so a rank imports the candidate as the referee named it), one thread each."""
        path = [p for p in sys.path if p and os.path.isdir(p)]
        extra = os.environ.get("PYTHONPATH")
        return {**os.environ, "OMP_NUM_THREADS": "1",
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
        how = f"exited with code {code}" if code is not None else "closed its connection"
        if code is not None and code < 0:
            how = f"was killed by signal {-code}"
        return how + (f"; output tail:\n{tail}" if tail else "")

    def close(self) -> None:
        """Stop every rank; kill each rank's whole process group (candidate children included)."""
        for conn in self.conns:
            try:
                send_obj(conn, "stop")
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
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        for log in self.logs:
            try:
                os.remove(log)
            except OSError:
                pass
        try:
            os.rmdir(self._logdir)
        except OSError:
            pass
        self._store = None

    def run(self, jobs: Sequence[RankJob], calls: int, on_report: Callable[[CallReport], None]) -> list[str]:
        """Send rank r ``jobs[r]`` and collect its reports; returns per-rank failure lines (empty = all answered).

        A rank that fails to load/prepare or raises stops the job; its peers then get
        ``_STOP_GRACE_S`` to finish or stop too, else the session is marked broken (they wait for it
        in a collective). A rank that exits or overruns the per-call deadline breaks the session at
        once. Other failed checks are reported and the ranks carry on in step.
        """
        members = self.conns[1:]  # group rank r is process r + 1
        for rank, job in enumerate(jobs):
            send_obj(members[rank], job)
        expected = {rank: -2 for rank in range(self.group_size)}  # last report received: -2 none, -1 load/prepare
        stopped: set[int] = set()  # ranks that gave up on this job (raised, or could not load/prepare)
        grace_end: float | None = None  # once a rank stopped: how long its peers get to finish or stop too
        stalls: dict[int, str] = {}
        since = {rank: time.monotonic() for rank in expected}
        while True:
            pending = [r for r, c in expected.items() if c < calls - 1 and r not in stopped]
            if not pending:
                return []
            remaining = min(since[r] for r in pending) + self.timeout_s - time.monotonic()
            if grace_end is not None:
                remaining = min(remaining, grace_end - time.monotonic())
            ready = wait([members[r] for r in pending], timeout=max(0.0, remaining))
            if not ready:
                self.broken = True  # ranks still inside the call: stuck in a collective or hung
                return [] if grace_end is not None else self._hung(pending, stalls, expected)
            for conn in ready:
                rank = members.index(conn)
                try:
                    msg = recv_obj(conn)
                except EOFError:
                    self.broken = True
                    return [f"rank {rank}: process {self.exit_reason(rank + 1)} (during {_step(expected[rank])})"]
                if isinstance(msg, tuple) and msg[0] == "stalled":
                    stalls[rank] = msg[3]
                    continue
                since[rank] = time.monotonic()
                stalls.pop(rank, None)
                on_report(msg)
                if msg.call < 0 and msg.failures or any(check == "raised" for check, _ in msg.failures):
                    stopped.add(rank)
                    grace_end = grace_end or time.monotonic() + _STOP_GRACE_S
                else:
                    expected[rank] = msg.call

    def _hung(self, pending: list[int], stalls: dict[int, str], expected: dict[int, int]) -> list[str]:
        """Name every rank without a result; ranks stuck in their own code first."""
        lines = []
        for rank in pending:
            where = stuck_where(stalls.get(rank))
            step = _step(expected[rank])
            lines.append((0 if "candidate code" in where and "torch.distributed" not in where else 1,
                          f"rank {rank}: timeout: no result within the {self.timeout_s:g} s deadline ({step}); {where}"))
        lines.sort()
        out = [text for _, text in lines]
        if all("torch.distributed" in text for text in out) and len(out) == self.group_size:
            out.append("every rank of the group is blocked inside torch.distributed: mismatched collectives, or a "
                       "collective over a group other than the supplied one (the default world group has a spare rank "
                       "that never joins)")
        return out


def _step(last: int) -> str:
    """The step a rank was in, given the last report received from it."""
    return "load/prepare" if last < -1 else f"call {last + 1}" if last >= 0 else "call 0"


def _refreshed(prev: Case, fresh: Case, live: tuple[str, ...], partial: bool) -> Case:
    """``prev`` with every rank's live inputs refreshed from ``fresh`` (a replay's values).

    A ``partial`` refresh (even replays) redraws only the trailing half (in memory order) of the
    floating-point live inputs and keeps the rest (the single-device pipeline's ``tail`` refill),
    so a result cached by a fingerprint of a few leading cells goes stale.
    """
    mode = "tail" if partial else "full"
    shares = [dataclasses.replace(p, inputs={**p.inputs, **{n: refilled(p.inputs[n], f.inputs[n], mode) for n in live}})
              for p, f in zip(rank_shares(prev), rank_shares(fresh))]
    return dataclasses.replace(prev, inputs=shares[0].inputs, meta={**prev.meta, "per_rank": shares})


def _finish(result: ProfileResult, performed: set[str], defn: SlotDef) -> ProfileResult:
    failed = {c.name for c in result.failures()}
    for name in CHECKS:
        if name in failed:
            continue
        if name in performed:
            result.record(name, PASS)
        elif name == "graph_replay":
            result.record(name, SKIP, "collective slots are not captured in CUDA graphs by this referee")
        elif (name == "prepare" and not defn.slot.needs_prepare) or (name == "audit" and defn.audit is None):
            continue
        else:
            result.record(name, SKIP, "not reached")
    return result


class _Judge:
    """The referee's side of one profile × seed: every rank's jobs, the references, the verdict."""

    def __init__(self, defn: SlotDef, cand_name: str, ref: KernelRef, profile: Profile, seed: int, opts: VerifyOptions,
                 stall_after_s: float, with_reference: bool = True):
        self.defn = defn
        self.result = ProfileResult(defn.name, profile.name, dtype_name(profile.dtype), profile.model, seed, cand_name)
        self.calls = 1 + opts.replays
        base = make_case(defn, profile, seed, 0)
        live = base.live_names()
        cases = [base]
        for call in range(1, self.calls):
            cases.append(_refreshed(cases[-1], make_case(defn, profile, seed, call), live, partial=call % 2 == 0))
        # trusted, here, before any rank runs (a torchrun rank that only runs the candidate skips it)
        self.expected = [defn.reference(clone_case(c)) for c in cases] if with_reference else []
        args = [(a.name, a.role.value) for a in defn.slot.args]
        self.jobs = [RankJob(profile.label, ref, args, [rank_shares(c)[rank].inputs for c in cases], live,
                             rank_shares(base)[rank].prepare_args, dict(base.outputs), stall_after_s)
                     for rank in range(world_of(profile))]
        self.performed: set[str] = set()

    def on_report(self, rep: CallReport) -> None:
        """Record a rank's failed checks and compare its outputs with the reference."""
        self.performed.update(rep.performed)
        for check, message in rep.failures:
            self.result.record(check, FAIL, f"rank {rep.rank}: {message}")
        if rep.call < 0 or not rep.outputs:
            return
        label = f"replay {rep.call}: " if rep.call else ""
        check = "replay" if rep.call else "compare"
        self.performed.add(check)
        for name, actual in rep.outputs.items():
            verdict = self.defn.comparator_for(name).compare(actual, self.expected[rep.call][name])
            key = f"{name}.{verdict.metric}"
            self.result.metrics[key] = min(self.result.metrics.get(key, verdict.value), verdict.value)
            if not verdict.passed:
                self.result.record(check, FAIL, f"rank {rep.rank}: {label}{name}: {verdict.describe()}")

    def finish(self, failure_lines: Sequence[str] = ()) -> ProfileResult:
        for line in failure_lines:
            self.result.record("raised", FAIL, line)
        return _finish(self.result, self.performed, self.defn)


def _run_profile(session: CollectiveSession, defn: SlotDef, cand: Candidate, profile: Profile, seed: int,
                 opts: VerifyOptions) -> ProfileResult:
    judge = _Judge(defn, cand.name, kernel_ref(cand.kernel), profile, seed, opts, _STALL_FRACTION * session.timeout_s)
    return judge.finish(session.run(judge.jobs, judge.calls, judge.on_report))


def _route(cands: list[Candidate], defn: SlotDef, profile: Profile, seed: int, device: str) -> tuple[Candidate | None, str]:
    desc = describe(defn, make_case(defn, profile, seed, 0), profile, device)
    for cand in cands:
        if cand.domain.matches(desc):
            return cand, ""
    if len(cands) == 1:
        return None, "outside declared domain: " + ", ".join(cands[0].domain.mismatches(desc))
    return None, "outside every variant's domain (the incumbent runs)"


def verify_collective(defn: SlotDef, candidates: Candidate | Sequence[Candidate], opts: VerifyOptions = VerifyOptions(),
                      progress: Progress | None = None, sessions: dict[int, CollectiveSession] | None = None) -> SlotReport:
    """Verify a collective slot on every selected profile whose group size is in ``opts.world_sizes``.

    ``sessions`` (group size -> running :class:`CollectiveSession`) lets a caller reuse rank
    processes across slots; the caller then closes them. A session a failure left broken is
    closed and replaced here either way.
    """
    owned = sessions is None
    sessions = {} if sessions is None else sessions
    cands = [candidates] if isinstance(candidates, Candidate) else list(candidates)
    report = SlotReport(defn.name, ", ".join(c.name for c in cands), "collective(spawned ranks)", opts.device)
    model = opts.model or next((c.model for c in cands if c.model), None)
    profiles = [p for p in select_profiles(defn, opts, model) if world_of(p) in opts.world_sizes]
    try:
        for profile in profiles:
            for seed in opts.seeds:
                result = _verify_one(defn, cands, profile, seed, opts, sessions)
                report.results.append(result)
                if progress:
                    progress(result)
    finally:
        while owned and sessions:
            sessions.popitem()[1].close()
    if not report.results:
        worlds = sorted({world_of(p) for p in defn.profiles})
        report.errors.append(f"no profile selected (world sizes {list(opts.world_sizes)}; this slot has {worlds}; "
                             "check --world-size/--dtype/--profile filters)")
    elif all(r.skipped_reason for r in report.results):
        report.errors.append("no profile falls inside any declared domain: the candidate was never exercised")
    return report


def _verify_one(defn: SlotDef, cands: list[Candidate], profile: Profile, seed: int, opts: VerifyOptions,
                sessions: dict[int, CollectiveSession]) -> ProfileResult:
    cand, skipped = _route(cands, defn, profile, seed, opts.device)
    if cand is None:
        res = ProfileResult(defn.name, profile.name, dtype_name(profile.dtype), profile.model, seed, "-")
        res.skipped_reason = skipped
        return res
    world = world_of(profile)
    try:
        kernel_ref(cand.kernel)
        if world not in sessions:
            sessions[world] = CollectiveSession(world, opts.device, opts.collective_timeout_s)
        elif sessions[world].timeout_s != opts.collective_timeout_s or sessions[world].device != opts.device:
            raise ValueError(f"the session for world {world} runs with device {sessions[world].device} and a "
                             f"{sessions[world].timeout_s:g} s deadline; these options ask for {opts.device} and "
                             f"{opts.collective_timeout_s:g} s")
    except (ValueError, SessionError) as exc:
        res = ProfileResult(defn.name, profile.name, dtype_name(profile.dtype), profile.model, seed, cand.name)
        res.record("raised", FAIL, str(exc))
        return _finish(res, set(), defn)
    session = sessions[world]
    result = _run_profile(session, defn, cand, profile, seed, opts)
    if session.broken:
        sessions.pop(world).close()
    return result


# ---------------------------------------------------------------- command line (local spawn or torchrun)

def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m kernelslot.verify.collective",
        description="Verify a collective slot. Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR set) every launched "
                    "process is one rank; otherwise the referee spawns the ranks locally.")
    p.add_argument("--slot", required=True, help="a collective slot, e.g. collective.all_reduce")
    p.add_argument("--kernel", help="candidate entry: 'module:qualname' or '/path/file.py:qualname' "
                                    "(default: the slot's built-in kernel)")
    p.add_argument("--prepare", help="candidate prepare, same forms (slots with prepare)")
    p.add_argument("--profile", action="append", help="profile name filter (repeatable), e.g. decode_batch.w2")
    p.add_argument("--dtype", action="append", choices=["float32", "bfloat16"], help="dtype filter (repeatable)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--replays", type=int, default=2)
    p.add_argument("--timeout", type=float, default=30.0, help="per-call deadline in seconds")
    p.add_argument("--world-size", type=int, action="append", help="local mode: group sizes to verify (default 2)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--spare-rank", action="store_true",
                   help="torchrun mode: global rank 0 is the referee and stays outside the candidate's group "
                        "(never runs candidate code; catches default-group use); the group is ranks 1..WORLD_SIZE-1")
    return p.parse_args(argv)


def _cli_candidate(a: argparse.Namespace, defn: SlotDef) -> Candidate:
    if a.kernel is None:
        return Candidate(defn.incumbent)
    if defn.slot.needs_prepare and a.prepare is None:
        raise SystemExit(f"{defn.name} needs --prepare as well as --kernel")
    return Candidate(Kernel(a.kernel, a.prepare, name=a.kernel))  # reference strings: loaded by the ranks only


def _print(result: ProfileResult, out: Any = sys.stdout) -> None:
    first = result.first_failure()
    why = f": {first.name}: {first.message.splitlines()[0]}" if first else ""
    metrics = " ".join(f"{k}={v:.4g}" for k, v in result.metrics.items())
    print(f"{result.status.upper():4} {result.slot} {result.profile}[{result.dtype}] seed={result.seed} {metrics}{why}",
          file=out, flush=True)


def _torchrun(a: argparse.Namespace, defn: SlotDef, cand: Candidate, opts: VerifyOptions) -> int:
    from kernelslot.verify.collective_worker import forbid_group_creation, run_job

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(a.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=3 * a.timeout + 30)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://", timeout=timeout)
    results_group = dist.new_group(backend="gloo", timeout=timeout)  # the referee's channel, never the candidate's
    members = list(range(1 if a.spare_rank else 0, world))
    group = dist.new_group(ranks=members, timeout=timeout)
    forbid_group_creation()
    profiles = [p for p in select_profiles(defn, opts, None) if world_of(p) == len(members)]
    if not profiles:
        if rank == 0:
            worlds = sorted({world_of(p) for p in defn.profiles})
            print(f"no {defn.name} profile for a group of {len(members)} ranks (profiles exist for {worlds}; "
                  "adjust --nproc-per-node/--nnodes or --spare-rank)", file=sys.stderr)
        return 2

    def relay(msg: Any) -> None:  # no parent process here: speak up at once, so a rank torchrun kills is heard
        if isinstance(msg, tuple) and msg[0] == "stalled":
            print(f"FAIL rank {dist.get_rank(group)}: timeout: no result within {a.timeout:g} s; {stuck_where(msg[3])}",
                  file=sys.stderr, flush=True)
            os._exit(124)
        for check, message in msg.failures:
            print(f"FAIL rank {msg.rank}: {check}: {message.splitlines()[0]}", file=sys.stderr, flush=True)
        reports.append(msg)

    ok, kernels = True, {}
    for profile in profiles:
        for seed in opts.seeds:
            # only the referee (global rank 0) computes references
            judge = _Judge(defn, cand.name, kernel_ref(cand.kernel), profile, seed, opts, a.timeout, rank == 0)
            reports: list[Any] = []
            if rank in members:
                group_rank = dist.get_rank(group)
                run_job(judge.jobs[group_rank], group_rank, group, device, relay, kernels)
            gathered: list[Any] = [None] * world if rank == 0 else []
            dist.gather_object(reports, gathered if rank == 0 else None, dst=0, group=results_group)
            if rank == 0:
                every = [rep for per_rank in gathered for rep in per_rank]
                for rep in every:
                    judge.on_report(rep)
                finished = {rep.rank for rep in every if rep.call == judge.calls - 1}
                unfinished = [f"rank {r}: stopped before the last call" for r in range(len(members)) if r not in finished]
                result = judge.finish(unfinished if not judge.result.failures() else ())
                ok &= result.passed
                _print(result)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kernelslot.verify.collective``: exit 0 when every selected profile passes."""
    from kernelslot.slots import get_slot

    a = _parse(argv)
    defn = get_slot(a.slot)
    if defn.slot.kind is not SlotKind.COLLECTIVE:
        raise SystemExit(f"{a.slot} is not a collective slot; use `kernelslot verify`")
    dtypes = tuple(getattr(torch, d) for d in a.dtype) if a.dtype else None
    opts = VerifyOptions(device=a.device, dtypes=dtypes, seeds=tuple(a.seeds), replays=a.replays,
                         profiles=tuple(a.profile) if a.profile else None,
                         world_sizes=tuple(a.world_size) if a.world_size else (2,), collective_timeout_s=a.timeout)
    cand = _cli_candidate(a, defn)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _torchrun(a, defn, cand, opts)
    report = verify_collective(defn, cand, opts, progress=_print)
    for err in report.errors:
        print(f"ERROR {err}", file=sys.stderr)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
