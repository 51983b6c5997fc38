"""The collective referee: verify a collective slot across real processes with torch.distributed.

Local mode (:func:`verify_collective`, what ``kernelslot verify`` runs for every
``SlotKind.COLLECTIVE`` slot): the rank processes of a
:class:`~kernelslot.verify.collective_session.CollectiveSession` run only the candidate and a
minimal call loop (:mod:`kernelslot.verify.collective_worker`). This process is their trusted
supervisor and the only one that judges: per profile × seed it builds every rank's inputs
(``Case.meta["per_rank"]``), allocates each rank's inputs, prepare arguments and padded-stride
outputs (inside canary buffers) *here*, in shared memory the rank maps, and before every call
refills the inputs in place and poisons the outputs itself. After the call it makes every check
from the shared tensors and its own snapshots — inputs unchanged, poison left, writes outside
the view, output storage swapped or aliased, retention (from the rank's use counts) — and
compares every rank's outputs with the reference computed here. Replies are JSON observations
(:mod:`kernelslot.verify.collective_wire`); nothing is ever unpickled.

The call sequence is the single-device pipeline's call plan (:mod:`kernelslot.verify.plan`): the
first call, replays with tail / head / sparse refills and a geometric number more (NaN poison, a
finite sentinel on the first replay), the engine-like plain-output call (contiguous outputs at
offset 0 filled with random values) at a random position, and on CUDA for ``graph_safe`` candidates a
captured-graph call replayed with fresh inputs and fresh poison. A call whose checks fail but
which returns keeps the ranks in step, so the remaining calls still run. Messages start with
``rank r:``; a rank that raises, exits, writes on its channel or hangs fails the profile with
the cause (see :mod:`kernelslot.verify.collective_session`).

torchrun mode (:func:`main` with ``RANK``/``WORLD_SIZE`` set): see docs/collectives.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from kernelslot.abi import AllocatedOutput, Role, allocate_output
from kernelslot.abi.tensor_spec import allocate_plain, canary_value
from kernelslot.slots.base import Candidate, Case, Kernel, KernelSource, Profile, SlotDef
from kernelslot.slots.collective import RankShare, rank_shares, world_of
from kernelslot.verify.checks import check_call, check_inputs, snapshot
from kernelslot.verify.collective_session import CollectiveSession, SessionError, stuck_where
from kernelslot.verify.collective_wire import share_storage, tensor_desc
from kernelslot.verify.pipeline import (_CALL_CHECKS, SINGLE_DEVICE_CHECKS, VerifyOptions, clone_case, describe, make_case,
                                        new_result, not_applicable, planner_for, profile_runs, select_profiles, tensors_in,
                                        to_device)
from kernelslot.verify.envelope import declared_bounds
from kernelslot.verify.plan import refill_inputs
from kernelslot.verify.report import CHECKS, FAIL, PASS, SKIP, ProfileResult, SlotReport
from kernelslot.verify.runner import CallObservation, InProcessRunner, TensorMeta

__all__ = ["verify_collective", "CollectiveSession", "SessionError", "main"]

Progress = Callable[[ProfileResult], None]
_STALL_FRACTION = 0.75  # a rank reports its stack after this fraction of the deadline
_PLAIN_CALL = 500  # case index of the plain-output call's fresh inputs


@dataclass(frozen=True)
class _Call:
    """One call of the sequence: which inputs, which poison, which outputs."""

    index: int  # case index (0 first call, r replay r, _PLAIN_CALL the plain-output call)
    refill: str = "full"  # a refill kind of verify/plan.py (replays)
    poison: str = "nan"  # nan | finite | random (the plain call)
    plain: bool = False  # contiguous outputs at offset 0, as an engine passes them
    graph: str | None = None  # capture | replay (CUDA graph)
    private: bool = False  # the rank hands the candidate private copies (not shared memory), copied back
    pick: int = 0  # places a sparse refill (the same positions on every rank)

    @property
    def label(self) -> str:
        if self.graph:
            return f"graph {self.graph}: "
        return "plain-output call: " if self.plain else f"replay {self.index}: " if self.index else ""

    @property
    def check(self) -> str:
        return "graph_replay" if self.graph else "replay" if self.index else "compare"


def call_sequence(opts: VerifyOptions, graphs: bool) -> list[_Call]:
    """The calls of one profile × seed (see the module docstring)."""
    calls = [_Call(c.draw, c.refill, "finite" if c.poison == "sentinel" else c.poison, c.plain, private=c.private,
                   pick=c.pick) for c in planner_for(opts).plan().calls]
    if graphs:
        calls += [_Call(1000, graph="capture"), _Call(1001, graph="replay"), _Call(1002, "tail", graph="replay")]
    return calls


def _advance(prev: Case, fresh: Case, live: tuple[str, ...], mode: str, pick: int = 0) -> Case:
    """``prev`` with every rank's live inputs refilled from ``fresh`` under refill kind ``mode``."""
    shares = [dataclasses.replace(p, inputs={**p.inputs, **refill_inputs({n: p.inputs[n] for n in live}, mode, pick,
                                                                          {n: f.inputs[n] for n in live})})
              for p, f in zip(rank_shares(prev), rank_shares(fresh))]
    return dataclasses.replace(prev, inputs=shares[0].inputs, meta={**prev.meta, "per_rank": shares})


def collective_overrun(alloc: AllocatedOutput, world: int) -> str:
    """Why the canary around a rank's output changed, when a collective library call did it.

    gloo (and any library that assumes a dense buffer) reduces ``numel`` contiguous elements from
    the view's first element, padding included: the padding then holds the sum of every rank's
    canary and the view's last rows are left unreduced. Returns the explanation and the fix, or
    "" when the changed cells do not look like that.
    """
    view = alloc.view
    if view.is_contiguous() or not view.numel():
        return ""
    start = view.storage_offset()
    changed = (~alloc.mask) & (alloc.base != canary_value(alloc.base.dtype))
    where = changed.nonzero().flatten()
    if not where.numel() or int(where.min()) < start or int(where.max()) >= start + view.numel():
        return ""
    summed = torch.tensor(canary_value(alloc.base.dtype) * world, dtype=torch.float64).to(alloc.base.dtype)
    if not bool((alloc.base[where] == summed).any()):
        return ""
    return (f"; the changed padding holds {world}x the canary, as a collective library call on the non-contiguous "
            f"output leaves it (gloo's all_reduce reduces the {view.numel()} contiguous elements from the view's start, "
            "padding included, and leaves its last rows unreduced): reduce a contiguous temporary, then copy into the output")


class _RankTensors:
    """One rank's tensors for one profile × seed, owned by the referee (shared memory in local mode)."""

    def __init__(self, share: RankShare, defn: SlotDef, outputs: dict, device: torch.device,
                 session: CollectiveSession | None):
        self.defn, self.session = defn, session
        self.inputs = to_device(share.inputs, device)
        self.prepare_args = to_device(share.prepare_args, device)
        self.outputs = {n: allocate_output(spec, device) for n, spec in outputs.items() if spec is not None}
        self.plain = {n: allocate_plain(spec, device) for n, spec in outputs.items() if spec is not None}
        self.keys: dict[int, int] = {}  # StorageImpl address -> key
        self.bases: dict[int, int] = {}  # key -> data pointer of the shared storage here
        self._pending: list[tuple[dict, int | None]] = []
        tensors = list(tensors_in(self.inputs).values()) + list(tensors_in(self.prepare_args).values())
        for t in tensors + [a.base for a in (*self.outputs.values(), *self.plain.values())]:
            self._key(t)  # shared before any identity is recorded (data pointers move once)
        self.prep_snap = snapshot(tensors_in(self.prepare_args))

    def _key(self, t: torch.Tensor) -> int:
        storage = t.untyped_storage()
        key = self.keys.get(storage._cdata)
        if key is None:
            key = self.session.new_key() if self.session else len(self.keys) + 1
            if self.session is not None:
                entry, fd = share_storage(storage)
                self._pending.append(({**entry, "key": key}, fd))
            self.keys[storage._cdata] = key
            self.bases[key] = storage.data_ptr()
        return key

    def take_storages(self) -> tuple[list[dict], list[int]]:
        """Storages not yet registered with the rank, and their fds (CPU storages only)."""
        pending, self._pending = self._pending, []
        return [e for e, _ in pending], [fd for _, fd in pending if fd is not None]

    def args(self, call: _Call) -> list[Any]:
        outs = self.plain if call.plain else self.outputs
        values = []
        for a in self.defn.slot.args:
            if a.role in (Role.INPUT, Role.SCALAR):
                values.append(self.inputs[a.name])
            elif a.role is Role.OUTPUT:
                values.append(outs[a.name].view if a.name in outs else None)
            else:
                values.append(a.role)  # PREPARED / GROUP: filled in where the call runs
        return values

    def describe_args(self, values: list[Any]) -> list[dict]:
        descs = []
        for v in values:
            if isinstance(v, torch.Tensor):
                descs.append(tensor_desc(self._key(v), v))
            elif v is Role.PREPARED:
                descs.append({"prepared": True})
            elif v is Role.GROUP:
                descs.append({"group": True})
            elif v is None:
                descs.append({"none": True})
            elif isinstance(v, (bool, int, float, str)):
                descs.append({"v": v})
            else:
                raise TypeError(f"cannot describe a {type(v).__name__} argument to a rank; collective cases hold tensors and scalars")
        return descs

    def observation(self, reply: dict, values: list[Any]) -> CallObservation:
        """A rank's JSON reply as a :class:`CallObservation` over this process's addresses (malformed = protocol)."""
        obs = CallObservation()
        if reply.get("error"):
            obs.error, obs.cause = str(reply["error"])[:20000], str(reply.get("cause") or "exception")[:40]
        if reply.get("returned") is not None:
            obs.returned = str(reply["returned"])[:200]
        meta = reply.get("meta")
        if not isinstance(meta, list) or len(meta) != len(values):
            raise ValueError("its observation lists no identity for every argument")
        obs.meta_after = [self._translate(m, v) for m, v in zip(meta, values)]
        retained = reply.get("retained", [])
        if not isinstance(retained, list):
            raise ValueError("'retained' is not a list")
        obs.retained = [int(i) for i in retained if isinstance(i, int) and 0 <= i < len(values)]
        return obs

    def _translate(self, meta: Any, value: Any) -> TensorMeta | None:
        if not isinstance(value, torch.Tensor):
            return None
        if meta == "same" or meta is None:
            return TensorMeta.of(value)
        base = self.bases.get(meta.get("key"), 0)
        return TensorMeta(base + int(meta["data_delta"]), base + int(meta["storage_delta"]), int(meta["nbytes"]),
                          tuple(int(s) for s in meta["shape"]), tuple(int(s) for s in meta["stride"]),
                          int(meta["offset"]), str(meta["dtype"]))


def _finish(result: ProfileResult, performed: set[str], defn: SlotDef, graph_why: str) -> ProfileResult:
    failed = {c.name for c in result.failures()}
    for name in CHECKS:
        if name in failed:
            continue
        if name in performed:
            result.record(name, PASS)
        elif name == "graph_replay":
            result.record(name, SKIP, graph_why)
        elif not_applicable(defn, name):
            continue
        elif name in SINGLE_DEVICE_CHECKS:
            result.record(name, SKIP, "not made by the collective referee yet (docs/referee.md, Known gaps)")
        else:
            result.record(name, SKIP, "not reached")
    return result


class _ProfileCheck:
    """The referee's side of one profile × seed: the calls, every rank's tensors, the checks and the verdict."""

    def __init__(self, defn: SlotDef, cand: Candidate, profile: Profile, seed: int, opts: VerifyOptions,
                 devices: Sequence[torch.device], session: CollectiveSession | None):
        self.defn, self.cand, self.profile, self.seed = defn, cand, profile, seed
        self.result = new_result(defn, profile, seed, cand.name)
        self.world = world_of(profile)
        self.graphs = torch.device(opts.device).type == "cuda" and opts.graph and cand.graph_safe
        self.calls = call_sequence(opts, self.graphs)
        self.case = make_case(defn, profile, seed, 0)
        self.live = self.case.live_names()
        self.devices = list(devices)
        self.ranks = [_RankTensors(share, defn, dict(self.case.outputs), devices[r], session)
                      for r, share in enumerate(rank_shares(self.case))]
        self.performed: set[str] = set()

    def graph_why(self) -> str:
        """Why the graph-replay check was skipped (when it was)."""
        return "not graph_safe" if not self.cand.graph_safe else "no CUDA device" if not self.graphs else "not reached"

    def prepare_failed(self, rank: int, reply: dict) -> bool:
        """Record a rank's load/prepare failure, or a prepare that changed its arguments."""
        if reply.get("error"):
            check = "prepare" if reply.get("cause") != "load_failed" or self.defn.slot.needs_prepare else "raised"
            text = str(reply["error"])[:20000].strip()
            self.result.record(check, FAIL, f"rank {rank}: {'could not load the candidate' if reply.get('cause') == 'load_failed' else 'prepare() raised'}: "
                               f"{text.splitlines()[-1] if text else ''}\n{text}")
            return True
        rt = self.ranks[rank]
        scratch = ProfileResult("", "", "", "", 0, "")
        if not check_inputs(scratch, tensors_in(rt.prepare_args), rt.prep_snap, "prepare(): "):
            self._merge(rank, scratch)
            return True
        if self.defn.slot.needs_prepare:
            self.performed.add("prepare")
        return False

    def begin(self, call: _Call) -> list[list[Any]]:
        """Refill every rank's live inputs in place and poison its outputs; returns each rank's arguments."""
        if call.index:
            self.case = _advance(self.case, make_case(self.defn, self.profile, self.seed, call.index), self.live, call.refill,
                                 call.pick)
        gen = torch.Generator().manual_seed(secrets.randbits(63))
        self._snaps = []
        values = []
        for rt, share in zip(self.ranks, rank_shares(self.case)):
            for name in self.live:
                rt.inputs[name].copy_(share.inputs[name])  # same storage, fresh values
            outs = rt.plain if call.plain else rt.outputs
            for alloc in outs.values():
                alloc.base.masked_fill_(~alloc.mask, canary_value(alloc.base.dtype))  # one overrun taints one call only
                if call.poison == "random":
                    alloc.poison_random(gen)
                else:
                    alloc.poison(finite=call.poison == "finite")
            self._snaps.append((snapshot(rt.inputs), {n: TensorMeta.of(a.view) for n, a in outs.items()}))
            values.append(rt.args(call))
        for dev in {d for d in self.devices if d.type == "cuda"}:  # the rank reads these writes from another process
            torch.cuda.synchronize(dev)
        return values

    def judge(self, call: _Call, rank: int, obs: CallObservation) -> None:
        """Every check of one rank's call, then the comparison with the reference computed here."""
        rt = self.ranks[rank]
        in_snap, out_meta = self._snaps[rank]
        outs = rt.plain if call.plain else rt.outputs
        scratch = ProfileResult("", "", "", "", 0, "")
        label = call.label
        check_inputs(scratch, rt.inputs, in_snap, label)
        check_inputs(scratch, tensors_in(rt.prepare_args), rt.prep_snap, label + "weights: ")
        names = [a.name for a in self.defn.slot.args]
        usable = check_call(scratch, obs, names, list(outs), outs, out_meta, {k: m for k, (_, m) in in_snap.items()}, label)
        for name, alloc in outs.items():
            why = "" if alloc.canary_intact() else collective_overrun(alloc, self.world)
            for c in scratch.checks:
                if why and c.name == "out_of_bounds_write" and f"output {name}:" in c.message:
                    c.message += why
        self.performed.update(_CALL_CHECKS)
        self._merge(rank, scratch)
        if not usable:
            return
        self.performed.add(call.check)
        expected = self.defn.reference(clone_case(self.case))
        for name, alloc in outs.items():
            verdict = self.defn.comparator_for(name, self.profile).compare(alloc.view.detach().cpu(), expected[name])
            key = f"{name}.{verdict.metric}"
            self.result.metrics[key] = min(self.result.metrics.get(key, verdict.value), verdict.value)
            if not verdict.passed:
                self.result.record(call.check, FAIL, f"rank {rank}: {label}{name}: {verdict.describe()}"
                                   + self._near_miss(name, alloc.view.detach().cpu()))

    def _near_miss(self, name: str, actual: torch.Tensor) -> str:
        """Which of the slot's named near-misses the output matches, if any (the likely cause)."""
        near = self.defn.near_miss_matching(clone_case(self.case), name, actual, self.profile)
        return f"; it matches the reference with {near}" if near else ""

    def _merge(self, rank: int, scratch: ProfileResult) -> None:
        for c in scratch.failures():
            self.result.record(c.name, FAIL, f"rank {rank}: {c.message}")

    def finish(self) -> ProfileResult:
        return _finish(self.result, self.performed, self.defn, self.graph_why())


def _job_frames(check: _ProfileCheck, src: KernelSource, stall_after_s: float) -> list[tuple[dict, list[int]]]:
    frames = []
    for rt in check.ranks:
        prep = rt.describe_args(list(rt.prepare_args)) if check.defn.slot.needs_prepare else None
        storages, fds = rt.take_storages()
        frames.append(({"op": "job", "kernel": dataclasses.asdict(src), "storages": storages, "prepare_args": prep,
                        "stall_after_s": stall_after_s}, fds))
    return frames


def _run_profile(session: CollectiveSession, defn: SlotDef, cand: Candidate, src: KernelSource, profile: Profile,
                 seed: int, opts: VerifyOptions) -> ProfileResult:
    check = _ProfileCheck(defn, cand, profile, seed, opts, [session.rank_device(r) for r in range(world_of(profile))], session)
    seq = 0
    replies, lines = session.exchange(_job_frames(check, src, _STALL_FRACTION * session.timeout_s), "prepared", seq, "load/prepare")
    stop = bool(lines)
    for rank, reply in sorted(replies.items()):
        stop |= check.prepare_failed(rank, reply)
    for call in check.calls if not stop else ():
        seq += 1
        values = check.begin(call)
        frames = []
        for rt, vals in zip(check.ranks, values):
            descs = rt.describe_args(vals)
            storages, fds = rt.take_storages()
            frames.append(({"op": "call", "args": descs, "storages": storages, "graph": call.graph,
                            "private": call.private}, fds))
        step = call.label.rstrip(": ") or "call 0"
        replies, lines = session.exchange(frames, "called", seq, step)
        raised = False
        for rank, reply in sorted(replies.items()):
            try:
                obs = check.ranks[rank].observation(reply, values[rank])
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                session.broken = True
                lines.append(f"rank {rank}: protocol: a malformed observation during {step} ({exc})")
                continue
            check.judge(call, rank, obs)
            raised |= obs.error is not None
        if lines or raised:
            break
    if not session.broken:
        seq += 1
        _, release_lines = session.exchange([({"op": "release", "keys": list(rt.bases)}, []) for rt in check.ranks],
                                            "released", seq, "the end of the profile")
        lines += release_lines
    for line in lines:
        check.result.record("raised", FAIL, line)
    return check.finish()


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
    report = SlotReport(defn.name, ", ".join(c.name for c in cands), "collective(isolated ranks)", opts.device)
    model = opts.model or next((c.model for c in cands if c.model), None)
    profiles = [p for p in select_profiles(defn, opts, model) if world_of(p) in opts.world_sizes]
    runs = profile_runs(defn, profiles, opts)  # drawn profiles keep their base's world size
    try:
        for profile, seed in runs:
            result = _verify_one(defn, cands, profile, seed, opts, sessions)
            report.results.append(result)
            if progress:
                progress(result)
    finally:
        while owned and sessions:
            sessions.popitem()[1].close()
    _record_world_envelope(report, cands, [p for p, _ in runs])
    if not report.results:
        worlds = sorted({world_of(p) for p in defn.profiles})
        report.errors.append(f"no profile selected (world sizes {list(opts.world_sizes)}; this slot has {worlds}; "
                             "check --world-size/--dtype/--profile filters)")
    elif all(r.skipped_reason for r in report.results):
        report.errors.append("no profile falls inside any declared domain: the candidate was never exercised")
    return report


def _record_world_envelope(report: SlotReport, cands: list[Candidate], profiles: list[Profile]) -> None:
    """A pass covers only the group sizes that ran: record each variant's verified world-size
    envelope (``dispatch`` routes only inside declared ∩ verified) and say where its domain admits
    world sizes beyond it."""
    by_name = {p.name: p for p in profiles}
    for cand in cands:
        worlds = sorted({world_of(by_name[r.profile]) for r in report.results
                         if r.kernel == cand.name and r.passed and r.profile in by_name})
        if not worlds:
            continue
        report.envelope.setdefault(cand.name, {})["world_size"] = [worlds[0], worlds[-1]]
        lo, hi = declared_bounds(cand.domain, "world_size")
        if lo < worlds[0] or hi > worlds[-1]:
            admits = f"{lo:g}..{hi:g}" if hi != float("inf") else f">= {lo:g}"
            report.notes.append(f"{cand.name}: its domain admits world_size {admits}; verified only at "
                                f"{', '.join(map(str, worlds))} (routes only inside world_size "
                                f"{worlds[0]}..{worlds[-1]}; add --world-size N to verify more)")


def _verify_one(defn: SlotDef, cands: list[Candidate], profile: Profile, seed: int, opts: VerifyOptions,
                sessions: dict[int, CollectiveSession]) -> ProfileResult:
    cand, skipped = _route(cands, defn, profile, seed, opts.device)
    if cand is None:
        res = new_result(defn, profile, seed, "-")
        res.skipped_reason = skipped
        return res
    world = world_of(profile)
    try:
        src = cand.kernel.origin()
        if world not in sessions:
            sessions[world] = CollectiveSession(world, opts.device, opts.collective_timeout_s)
        elif sessions[world].timeout_s != opts.collective_timeout_s or sessions[world].device != opts.device:
            raise ValueError(f"the session for world {world} runs with device {sessions[world].device} and a "
                             f"{sessions[world].timeout_s:g} s deadline; these options ask for {opts.device} and "
                             f"{opts.collective_timeout_s:g} s")
    except (ValueError, SessionError) as exc:
        res = new_result(defn, profile, seed, cand.name)
        res.record("raised", FAIL, str(exc))
        return _finish(res, set(), defn, "not reached")
    session = sessions[world]
    result = _run_profile(session, defn, cand, src, profile, seed, opts)
    if session.broken:
        sessions.pop(world).close()
    return result


if __name__ == "__main__":  # python -m kernelslot.verify.collective: the command line lives in collective_cli
    from kernelslot.verify.collective_cli import main

    sys.exit(main())
