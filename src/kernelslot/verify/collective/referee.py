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
finite sentinel on the first replay; private tensors and poisoned scratch at random), the
engine-like plain-output call (contiguous outputs at offset 0 filled with random values, private
tensors) at a random position, the state steps — a re-prepare after the weights were reloaded in
place (slots with ``prepare``: check ``reprepare``) and a repeat of the previous call on poisoned
scratch (check ``determinism``: bitwise equal outputs) — and on CUDA for ``graph_safe`` candidates a
captured-graph call replayed with fresh inputs and fresh poison. A call whose checks fail but
which returns keeps the ranks in step, so the remaining calls still run. Messages start with
``rank r:``; a rank that raises, exits, writes on its channel or hangs fails the profile with
the cause (see :mod:`kernelslot.verify.collective.session`).

After every call all ranks returned from, the referee watches a settle window (:data:`SETTLE_S`;
:data:`THREAD_SETTLE_S` when the call left a thread it started alive) and re-reads every tensor of
every rank: a write after the call returned fails (``late_write``), as does a rank thread that keeps
using CPU (``thread_left_running``); both end the profile and replace the ranks. Numeric state is
judged twice (``global_state_changed``): the rank's own snapshot around every load, prepare and
call (reported in its reply, put back there), and every rank thread's floating-point control state
read from outside after every exchange (ptrace; a change there cannot be put back, so the ranks
are replaced after the profile). A deadline that passed, a rank that died or a failed load ends the
candidate's verification: its remaining profiles are recorded as not run, with the cause, so a
deadlock costs one deadline per candidate, not one per profile.

torchrun mode (``python -m kernelslot.verify.collective`` under torchrun): :mod:`kernelslot.verify.collective.cli`.
"""
from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Sequence

import torch

from kernelslot.abi import AllocatedOutput
from kernelslot.abi.tensor_spec import canary_value
from kernelslot.isolation.observe import TensorMeta, bits_equal
from kernelslot.isolation.runner import CallObservation
from kernelslot.slots.base import Candidate, Case, KernelSource, Profile, SlotDef
from kernelslot.slots.collective import rank_shares, world_of
from kernelslot.verify.cases import clone_case, make_case, new_result, profile_runs, route, select_profiles, tensors_in
from kernelslot.verify.checks import CALL_CHECKS, SINGLE_DEVICE_CHECKS, check_call, check_inputs, finish_checks, snapshot
from kernelslot.verify.collective.session import CollectiveSession, SessionError
from kernelslot.verify.collective.tensors import RankTensors, state_text
from kernelslot.verify.envelope import declared_bounds
from kernelslot.verify.options import Progress, VerifyOptions
from kernelslot.verify.plan import PlannedCall, planner_for, refill_inputs
from kernelslot.verify.verdict import FAIL, Check, ProfileResult, SlotReport

__all__ = ["verify_collective", "ProfileCheck", "call_sequence", "call_label", "call_check", "collective_overrun",
           "SETTLE_S", "THREAD_SETTLE_S"]

_STALL_FRACTION = 0.75  # a rank reports its stack after this fraction of the deadline
SETTLE_S = 0.02  # the settle window after every call (the worker runner's default)
THREAD_SETTLE_S = 0.25  # ... after a call that left a thread it started alive (a late writer sleeps in one)


def call_label(call: PlannedCall) -> str:
    """The label a rank's failure message starts with (``replay 2: ``; empty for the first call)."""
    if call.graph:
        return f"graph {call.graph}: "
    if call.refill in ("reprepare", "repeat"):
        return call.label
    return "plain-output call: " if call.plain else f"replay {call.draw}: " if call.draw else ""


def call_check(call: PlannedCall) -> str:
    """The check a call's comparison counts for."""
    if call.graph:
        return Check.GRAPH_REPLAY
    return Check.REPREPARE if call.refill == "reprepare" else Check.REPLAY if call.draw else Check.COMPARE


def call_sequence(defn: SlotDef, opts: VerifyOptions, graphs: bool, longer: int = 0) -> list[PlannedCall]:
    """The calls of one profile × seed: the call plan's with its state steps (a re-prepare for slots with
    ``prepare``, the repeat on poisoned scratch; collective slots declare no metamorphic relation),
    ``longer`` more extra replays for the secret long run (:meth:`Planner.lengthened`), then the graph
    steps on CUDA."""
    if defn.relations:
        raise ValueError(f"{defn.name}: the collective referee makes no metamorphic step; a collective slot declares no relation")
    planner = planner_for(opts)
    plan = planner.plan(reprepare=defn.slot.needs_prepare, repeat=True)
    calls = list((planner.lengthened(plan, longer) if longer else plan).calls)
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


def _finish(result: ProfileResult, performed: set[str], defn: SlotDef, graph_why: str) -> ProfileResult:
    return finish_checks(result, performed, defn, graph_why,
                         unmade={c: "not made by the collective referee (docs/referee.md, Known gaps)" for c in SINGLE_DEVICE_CHECKS})


class ProfileCheck:
    """The referee's side of one profile × seed: the calls, every rank's tensors, the checks and the verdict."""

    def __init__(self, defn: SlotDef, cand: Candidate, profile: Profile, seed: int, opts: VerifyOptions,
                 devices: Sequence[torch.device], session: CollectiveSession | None, longer: int = 0):
        """``longer``: extra replays of the secret long run when this is the long profile run."""
        self.defn, self.cand, self.profile, self.seed = defn, cand, profile, seed
        self.result = new_result(defn, profile, seed, cand.name)
        self.world = world_of(profile)
        self.graphs = torch.device(opts.device).type == "cuda" and opts.graph and cand.graph_safe
        self.calls = call_sequence(defn, opts, self.graphs, longer)
        self.case = make_case(defn, profile, seed, 0)
        self.live = self.case.live_names()
        self.devices = list(devices)
        self.ranks = [RankTensors(share, defn, dict(self.case.outputs), devices[r], session)
                      for r, share in enumerate(rank_shares(self.case))]
        self.performed: set[str] = set()
        self.last: list[dict[str, torch.Tensor] | None] = [None] * self.world  # each rank's last clean outputs (repeat)
        self.inside_changed = [False] * self.world  # whether the rank's own snapshot saw a change in its last exchange
        self.replace_ranks = ""  # why the ranks must not serve another profile (state that could not be put back)
        self.load_failed = ""  # why the candidate could not be loaded, when it could not

    def graph_why(self) -> str:
        """Why the graph-replay check was skipped (when it was)."""
        return "not graph_safe" if not self.cand.graph_safe else "no CUDA device" if not self.graphs else "not reached"

    def prepare_failed(self, rank: int, reply: dict, again: bool = False) -> bool:
        """Record a rank's load/prepare failure (``again``: of the re-prepare step), a prepare that changed
        its arguments, or numeric state the load or prepare changed (a failure, but the calls go on)."""
        try:
            changed = state_text(reply)
        except TypeError:
            changed = "its report of the numeric state is malformed"
        what = "re-prepare(): " if again else "load/prepare: "
        self.inside_changed[rank] = bool(changed)
        if changed:
            self.result.record(Check.GLOBAL_STATE_CHANGED, FAIL, f"rank {rank}: {what}{changed}")
        self.unrestored(rank, reply)
        if reply.get("error"):
            load = reply.get("cause") == "load_failed"
            check = Check.REPREPARE if again else Check.PREPARE if not load or self.defn.slot.needs_prepare else Check.RAISED
            text = str(reply["error"])[:20000].strip()
            self.result.record(check, FAIL, f"rank {rank}: {'could not load the candidate' if load else what.rstrip(': ') + ' raised'}: "
                               f"{text.splitlines()[-1] if text else ''}\n{text}")
            if load:
                self.load_failed = f"the candidate failed to load: {text.splitlines()[-1] if text else 'no reason given'}"
            return True
        rt = self.ranks[rank]
        scratch = ProfileResult("", "", "", "", 0, "")
        if not check_inputs(scratch, tensors_in(rt.prepare_args), rt.prep_snap, "re-prepare(): " if again else "prepare(): "):
            self._merge(rank, scratch)
            return True
        if self.defn.slot.needs_prepare:
            self.performed.add(Check.PREPARE)
        return False

    def unrestored(self, rank: int, reply: dict) -> None:
        """A rank whose numeric state could not be put back (its reply says so) serves no further profile."""
        if reply.get("global_state_unrestored") and not self.replace_ranks:
            self.replace_ranks = f"rank {rank}: numeric state that could not be put back"

    def prepare_frames(self) -> list[tuple[dict, list[int]]]:
        """The re-prepare step's request to every rank: ``prepare`` again on its (reloaded) weights."""
        return [({"op": "prepare", "args": rt.describe_args(list(rt.prepare_args))}, []) for rt in self.ranks]

    def _reload(self, draw: int) -> None:
        """The weights of draw ``draw`` written into every rank's weight storages (a reload in place: same
        storages, new values) and that draw's live inputs taken for the next call; ``prepare`` runs again next."""
        fresh = rank_shares(make_case(self.defn, self.profile, self.seed, draw))
        shares = []
        for rt, old, new in zip(self.ranks, rank_shares(self.case), fresh):
            weights, values = tensors_in(rt.prepare_args), tensors_in(new.prepare_args)
            if list(weights) != list(values) or any((t.shape, t.dtype) != (values[k].shape, values[k].dtype) for k, t in weights.items()):
                raise ValueError(f"{self.defn.name}/{self.profile.label}: make_case draws prepare arguments of other shapes "
                                 "for another call id (a catalog defect: shapes must depend on the profile only)")
            for name, t in weights.items():
                t.copy_(values[name])
            rt.prep_snap = snapshot(weights)
            shares.append(dataclasses.replace(old, inputs={**old.inputs, **{n: new.inputs[n] for n in self.live}},
                                              prepare_args=new.prepare_args))
        self.case = dataclasses.replace(self.case, inputs=shares[0].inputs, prepare_args=shares[0].prepare_args,
                                        meta={**self.case.meta, "per_rank": shares})

    def begin(self, call: PlannedCall) -> list[list[Any]]:
        """Refill every rank's live inputs in place (a re-prepare step reloads the weights too; a repeat keeps
        the inputs) and poison its outputs; returns each rank's arguments."""
        if call.refill == "reprepare":
            self._reload(call.draw)
        elif call.refill != "repeat" and call.draw:
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
        if call.refill == "repeat" and obs.error is None and self.last[rank] is not None:
            self._same_bits(scratch, outs, self.last[rank], label)  # first: poisoned scratch in an output is its finding
        names = [a.name for a in self.defn.slot.args]
        usable = check_call(scratch, obs, names, list(outs), outs, out_meta, {k: m for k, (_, m) in in_snap.items()}, label)
        for name, alloc in outs.items():
            why = "" if alloc.canary_intact() else collective_overrun(alloc, self.world)
            for c in scratch.checks:
                if why and c.name == Check.OUT_OF_BOUNDS_WRITE and f"output {name}:" in c.message:
                    c.message += why
        self.performed.update(CALL_CHECKS + ((Check.GLOBAL_STATE_CHANGED,) if obs.error is None else ()))
        self.inside_changed[rank] = bool(obs.state_changed)
        self._merge(rank, scratch)
        self.last[rank] = None
        if not usable:
            return
        check = call_check(call)
        self.performed.add(check)
        expected = self.defn.reference(clone_case(self.case))
        compared = True
        for name, alloc in outs.items():
            verdict = self.defn.comparator_for(name, self.profile).compare(alloc.view.detach().cpu(), expected[name])
            key = f"{name}.{verdict.metric}"
            self.result.metrics[key] = min(self.result.metrics.get(key, verdict.value), verdict.value)
            if not verdict.passed:
                compared = False
                self.result.record(check, FAIL, f"rank {rank}: {label}{name}: {verdict.describe()}"
                                   + self._near_miss(name, alloc.view.detach().cpu()))
        if compared and not scratch.failures():  # what a repeat of this call must reproduce bit for bit
            self.last[rank] = {n: a.view.detach().cpu().clone() for n, a in outs.items()}

    def _same_bits(self, scratch: ProfileResult, outs: dict[str, AllocatedOutput], before: dict[str, torch.Tensor],
                   label: str) -> None:
        """The ``determinism`` verdict of a repeated call: every output bitwise equal to the previous call's."""
        self.performed.add(Check.DETERMINISM)
        for name, alloc in outs.items():
            now = alloc.view.detach().cpu()
            if not bits_equal(now, before[name]):
                differ = (now.contiguous().view(torch.uint8) != before[name].contiguous().view(torch.uint8)).sum().item()
                scratch.record(Check.DETERMINISM, FAIL, f"{label}{name}: {differ} byte(s) differ from the previous call on the "
                               "same inputs; the freed memory of the allocators was filled with poison (NaN) before this "
                               "call: does the kernel read scratch it never wrote?")

    def settle(self, call: PlannedCall, session: CollectiveSession, started: list[set[int]]) -> bool:
        """The settle window after a call every rank returned from: no tensor of any rank may change and no
        rank thread may keep using CPU (each a ``raised`` failure: ``late_write``, ``thread_left_running``).
        ``started``: each rank's threads before the call; where the call left one it started alive, the
        window is :data:`THREAD_SETTLE_S`. False (the ranks must be replaced) on a finding."""
        watched = [[(n, t, t.detach().clone()) for n, t in rt.tensors(call.plain)] for rt in self.ranks]
        new = [now - before for now, before in zip(session.threads(), started)]
        window = THREAD_SETTLE_S if any(new) else SETTLE_S
        busy, numeric = session.settle(window)
        label = call_label(call)
        self._outside(numeric, label or "call 0: ")
        clean = True
        for rank, tensors in enumerate(watched):
            changed = [n for n, t, copy in tensors if not bits_equal(t.detach(), copy)]
            if changed:
                self.result.record(Check.RAISED, FAIL, f"rank {rank}: {label}late_write: {changed[0]} changed within "
                                   f"{window * 1e3:g} ms after entry returned (a background thread or stream still "
                                   "writing?); all work must finish before entry returns")
            elif rank in busy:
                self.result.record(Check.RAISED, FAIL, f"rank {rank}: {label}thread_left_running: {busy[rank]}")
            clean &= not changed and rank not in busy
        return clean

    def observe_outside(self, session: CollectiveSession, label: str) -> None:
        """Every rank thread's floating-point control state, read from outside after a load or prepare
        exchange (after a call: in its settle window)."""
        self._outside(session.numeric_changes(), label)

    def _outside(self, numeric: dict[int, list[str]], label: str) -> None:
        """Record what an outside reading found: a change fails ``global_state_changed`` and cannot be put
        back from here (the ranks are replaced)."""
        for rank, lines in sorted(numeric.items()):
            text = "; ".join(lines[:4]) + (f" (+{len(lines) - 4} more)" if len(lines) > 4 else "")
            inside = self.inside_changed[rank]
            self.result.record(Check.GLOBAL_STATE_CHANGED, FAIL, f"rank {rank}: {label}read from outside the rank "
                               f"process (ptrace), candidate code left changed: {text}" + ("" if inside else
                               "; the rank's own snapshot reported no change (replaced by the candidate?)"))
            self.replace_ranks = self.replace_ranks or text

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


def _run_profile(session: CollectiveSession, check: ProfileCheck, src: KernelSource) -> ProfileResult:
    """One profile × seed in ``session``'s ranks: the job (load, prepare), every planned call with its
    checks and settle window, then the release; the session is left broken where its ranks must not
    serve another profile."""
    seq = 0
    replies, lines = session.exchange(_job_frames(check, src, _STALL_FRACTION * session.timeout_s), "prepared", seq, "load/prepare")
    stop = bool(lines) | any([check.prepare_failed(rank, reply) for rank, reply in sorted(replies.items())])
    if not lines:
        check.observe_outside(session, "load/prepare: ")
    for call in check.calls if not stop else ():
        seq += 1
        values = check.begin(call)
        if call.refill == "reprepare":
            replies, lines = session.exchange(check.prepare_frames(), "prepared", seq, "re-prepare")
            if lines or any([check.prepare_failed(rank, reply, again=True) for rank, reply in sorted(replies.items())]):
                break
            check.observe_outside(session, "re-prepare(): ")
            seq += 1
        frames = []
        for rt, vals in zip(check.ranks, values):
            descs = rt.describe_args(vals)
            storages, fds = rt.take_storages()
            frames.append(({"op": "call", "args": descs, "storages": storages, "graph": call.graph,
                            "private": call.private, "scratch": call.scratch}, fds))
        step = call_label(call).rstrip(": ") or "call 0"
        started = session.threads()
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
            check.unrestored(rank, reply)
            raised |= obs.error is not None
        if lines or raised:
            break
        if not check.settle(call, session, started):
            session.broken = True  # a candidate thread still runs in a rank
            break
    if not session.broken:
        seq += 1
        _, release_lines = session.exchange([({"op": "release", "keys": list(rt.bases)}, []) for rt in check.ranks],
                                            "released", seq, "the end of the profile")
        lines += release_lines
    session.broken |= bool(check.replace_ranks)
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
    unavailable: dict[KernelSource, str] = {}  # sources that hung, lost a rank or failed to load: why
    # the secret long run (verify/plan.py), as in the single-device pipeline: one run the domain admits
    long = planner_for(opts).draw_long_run(len(runs), lambda i: route(defn, cands, *runs[i], opts.device)[0] is not None)
    try:
        for i, (profile, seed) in enumerate(runs):
            longer = long[1] if long is not None and long[0] == i else 0
            result = _verify_one(defn, cands, profile, seed, opts, sessions, unavailable, report.notes, longer)
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
                sessions: dict[int, CollectiveSession], unavailable: dict[KernelSource, str], notes: list[str],
                longer: int = 0) -> ProfileResult:
    """One profile run: routed to its variant, skipped as not run where that candidate already hung, lost a
    rank or failed to load, else run in the world size's session (started here if needed)."""
    cand, skipped = route(defn, cands, profile, seed, opts.device)
    if cand is None:
        res = new_result(defn, profile, seed, "-")
        res.skipped_reason = skipped
        return res
    world = world_of(profile)
    try:
        src = cand.kernel.origin()
        if src in unavailable:
            res = new_result(defn, profile, seed, cand.name)
            res.skipped_reason = f"not run: {unavailable[src]}"
            return res
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
    if session.unobserved and not any(session.unobserved in n for n in notes):
        notes.append(f"world {world}: the ranks' floating-point control state was not read from outside "
                     f"({session.unobserved}); numeric state was judged from the ranks' own reports only")
    check = ProfileCheck(defn, cand, profile, seed, opts, [session.rank_device(r) for r in range(world)], session, longer)
    result = _run_profile(session, check, src)
    if session.fatal or check.load_failed:  # a hang costs one deadline per candidate, not one per profile
        unavailable[src] = (f"{session.fatal or check.load_failed}, in {profile.label} seed {seed}; a hang, a dead rank "
                            "or a failed load ends the candidate's verification (one deadline per candidate, not per profile)")
    if session.broken:
        sessions.pop(world).close()
    return result
