"""The collective referee: verify a collective slot across real processes with torch.distributed.

Local mode (:func:`verify_collective`, what ``kernelslot verify`` runs for every
``SlotKind.COLLECTIVE`` slot): the rank processes of a
:class:`~kernelslot.verify.collective.session.CollectiveSession` run only the candidate and a
minimal call loop (:mod:`kernelslot.verify.collective.rank`). This process is their trusted
supervisor and the only one that judges: per profile × seed it builds every rank's inputs
(``Case.meta["per_rank"]``), allocates each rank's inputs, prepare arguments and padded-stride
outputs (inside canary buffers) *here*, in shared memory the rank maps, and before every call
refills the inputs in place and poisons the outputs itself. After the call it makes every check
from the shared tensors and its own snapshots — inputs unchanged, poison left, writes outside
the view, output storage swapped or aliased, retention (from the rank's use counts) — and
compares every rank's outputs with the reference computed here. Replies are JSON observations
(:mod:`kernelslot.isolation.wire`); nothing is ever unpickled.

The call sequence is the single-device pipeline's call plan (:mod:`kernelslot.verify.plan`): the
first call, replays with tail / head / sparse refills and a geometric number more (NaN poison, a
finite sentinel on the first replay), the engine-like plain-output call (contiguous outputs at
offset 0 filled with random values) at a random position, and on CUDA for ``graph_safe`` candidates a
captured-graph call replayed with fresh inputs and fresh poison. A call whose checks fail but
which returns keeps the ranks in step, so the remaining calls still run. Messages start with
``rank r:``; a rank that raises, exits, writes on its channel or hangs fails the profile with
the cause (see :mod:`kernelslot.verify.collective.session`).

torchrun mode (``python -m kernelslot.verify.collective`` under torchrun): :mod:`kernelslot.verify.collective.cli`.
"""
from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Sequence

import torch

from kernelslot.abi import AllocatedOutput, Role, allocate_output
from kernelslot.abi.tensor_spec import allocate_plain, canary_value
from kernelslot.isolation.observe import TensorMeta, translate_meta
from kernelslot.isolation.runner import CallObservation
from kernelslot.isolation.wire import share_storage, tensor_desc
from kernelslot.slots.base import Candidate, Case, KernelSource, Profile, SlotDef
from kernelslot.slots.collective import RankShare, rank_shares, world_of
from kernelslot.verify.cases import call_args, clone_case, make_case, new_result, profile_runs, route, select_profiles, tensors_in, to_device
from kernelslot.verify.checks import CALL_CHECKS, SINGLE_DEVICE_CHECKS, check_call, check_inputs, finish_checks, snapshot
from kernelslot.verify.collective.session import CollectiveSession, SessionError
from kernelslot.verify.envelope import declared_bounds
from kernelslot.verify.options import Progress, VerifyOptions
from kernelslot.verify.plan import PlannedCall, planner_for, refill_inputs
from kernelslot.verify.verdict import FAIL, Check, ProfileResult, SlotReport

__all__ = ["verify_collective", "ProfileCheck", "call_sequence", "call_label", "call_check", "collective_overrun"]

_STALL_FRACTION = 0.75  # a rank reports its stack after this fraction of the deadline


def call_label(call: PlannedCall) -> str:
    """The label a rank's failure message starts with (``replay 2: ``; empty for the first call)."""
    if call.graph:
        return f"graph {call.graph}: "
    return "plain-output call: " if call.plain else f"replay {call.draw}: " if call.draw else ""


def call_check(call: PlannedCall) -> str:
    """The check a call's comparison counts for."""
    return Check.GRAPH_REPLAY if call.graph else Check.REPLAY if call.draw else Check.COMPARE


def call_sequence(opts: VerifyOptions, graphs: bool) -> list[PlannedCall]:
    """The calls of one profile × seed: the call plan's (no state steps yet), then the graph steps on CUDA."""
    calls = list(planner_for(opts).plan().calls)
    if graphs:
        calls += [PlannedCall(1000, "full", "nan", graph="capture"), PlannedCall(1001, "full", "nan", graph="replay"),
                  PlannedCall(1002, "tail", "nan", graph="replay")]
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

    def args(self, call: PlannedCall) -> list[Any]:
        # PREPARED / GROUP: the role itself, filled in where the call runs
        return call_args(self.defn, self.inputs, self.plain if call.plain else self.outputs, lambda a: a.role)

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
        obs.meta_after = [translate_meta(m, v, lambda key: self.bases.get(key, 0)) for m, v in zip(meta, values)]
        retained = reply.get("retained", [])
        if not isinstance(retained, list):
            raise ValueError("'retained' is not a list")
        obs.retained = [int(i) for i in retained if isinstance(i, int) and 0 <= i < len(values)]
        return obs


def _finish(result: ProfileResult, performed: set[str], defn: SlotDef, graph_why: str) -> ProfileResult:
    return finish_checks(result, performed, defn, graph_why,
                         unmade={c: "not made by the collective referee yet (docs/referee.md, Known gaps)" for c in SINGLE_DEVICE_CHECKS})


class ProfileCheck:
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
            check = Check.PREPARE if reply.get("cause") != "load_failed" or self.defn.slot.needs_prepare else Check.RAISED
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
            self.performed.add(Check.PREPARE)
        return False

    def begin(self, call: PlannedCall) -> list[list[Any]]:
        """Refill every rank's live inputs in place and poison its outputs; returns each rank's arguments."""
        if call.draw:
            self.case = _advance(self.case, make_case(self.defn, self.profile, self.seed, call.draw), self.live, call.refill,
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
                    alloc.poison(finite=call.poison == "sentinel")
            self._snaps.append((snapshot(rt.inputs), {n: TensorMeta.of(a.view) for n, a in outs.items()}))
            values.append(rt.args(call))
        for dev in {d for d in self.devices if d.type == "cuda"}:  # the rank reads these writes from another process
            torch.cuda.synchronize(dev)
        return values

    def judge(self, call: PlannedCall, rank: int, obs: CallObservation) -> None:
        """Every check of one rank's call, then the comparison with the reference computed here."""
        rt = self.ranks[rank]
        in_snap, out_meta = self._snaps[rank]
        outs = rt.plain if call.plain else rt.outputs
        scratch = ProfileResult("", "", "", "", 0, "")
        label = call_label(call)
        check_inputs(scratch, rt.inputs, in_snap, label)
        check_inputs(scratch, tensors_in(rt.prepare_args), rt.prep_snap, label + "weights: ")
        names = [a.name for a in self.defn.slot.args]
        usable = check_call(scratch, obs, names, list(outs), outs, out_meta, {k: m for k, (_, m) in in_snap.items()}, label)
        for name, alloc in outs.items():
            why = "" if alloc.canary_intact() else collective_overrun(alloc, self.world)
            for c in scratch.checks:
                if why and c.name == Check.OUT_OF_BOUNDS_WRITE and f"output {name}:" in c.message:
                    c.message += why
        self.performed.update(CALL_CHECKS)
        self._merge(rank, scratch)
        if not usable:
            return
        check = call_check(call)
        self.performed.add(check)
        expected = self.defn.reference(clone_case(self.case))
        for name, alloc in outs.items():
            verdict = self.defn.comparator_for(name, self.profile).compare(alloc.view.detach().cpu(), expected[name])
            key = f"{name}.{verdict.metric}"
            self.result.metrics[key] = min(self.result.metrics.get(key, verdict.value), verdict.value)
            if not verdict.passed:
                self.result.record(check, FAIL, f"rank {rank}: {label}{name}: {verdict.describe()}"
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


def _job_frames(check: ProfileCheck, src: KernelSource, stall_after_s: float) -> list[tuple[dict, list[int]]]:
    frames = []
    for rt in check.ranks:
        prep = rt.describe_args(list(rt.prepare_args)) if check.defn.slot.needs_prepare else None
        storages, fds = rt.take_storages()
        frames.append(({"op": "job", "kernel": dataclasses.asdict(src), "storages": storages, "prepare_args": prep,
                        "stall_after_s": stall_after_s}, fds))
    return frames


def _run_profile(session: CollectiveSession, defn: SlotDef, cand: Candidate, src: KernelSource, profile: Profile,
                 seed: int, opts: VerifyOptions) -> ProfileResult:
    check = ProfileCheck(defn, cand, profile, seed, opts, [session.rank_device(r) for r in range(world_of(profile))], session)
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
        step = call_label(call).rstrip(": ") or "call 0"
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
        check.result.record(Check.RAISED, FAIL, line)
    return check.finish()


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
    cand, skipped = route(defn, cands, profile, seed, opts.device)
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
        res.record(Check.RAISED, FAIL, str(exc))
        return _finish(res, set(), defn, "not reached")
    session = sessions[world]
    result = _run_profile(session, defn, cand, src, profile, seed, opts)
    if session.broken:
        sessions.pop(world).close()
    return result

