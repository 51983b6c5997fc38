"""The single-device pipeline (docs/referee.md): inputs → reference → outputs → poison → call →
checks → compare → replay → (CUDA graph replay) → timing, for every profile and seed.

References always run on the CPU, on clones, in this process; the candidate runs through a
:class:`~kernelslot.isolation.runner.Runner`. Nothing the candidate does can raise out of here:
every failure becomes a named check in the :class:`~kernelslot.verify.verdict.ProfileResult`.
The front door is :func:`kernelslot.verify.referee.verify_slot`; this wing's entry is
:func:`verify_single`.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable, Iterator, Sequence

import torch

from kernelslot.abi import Arg, Role, SlotKind, allocate_output
from kernelslot.abi.capability import CallDescriptor
from kernelslot.abi.comparators import resolve_expected
from kernelslot.abi.tensor_spec import allocate_plain
from kernelslot.isolation.observe import TensorMeta
from kernelslot.isolation.runner import CallObservation, InProcessRunner, Runner, RunnerError
from kernelslot.slots.base import Candidate, Case, Profile, SlotDef
from kernelslot.verify.cases import (call_args, clone_case, describe, make_case, new_result, profile_runs, refill_live, route,
                                     select_profiles, tensors_in, to_device)
from kernelslot.verify.checks import CALL_CHECKS, bits_equal, check_call, check_inputs, finish_checks, snapshot
from kernelslot.verify.envelope import boundary_profiles, verified_envelope
from kernelslot.verify.options import Progress, VerifyOptions
from kernelslot.verify.plan import CallPlan, PlannedCall, Planner, TimingPlan, planner_for
from kernelslot.verify.verdict import FAIL, Check, ProfileResult, SlotReport, traceback_summary

__all__ = ["ProfileRun", "verify_single", "plan_for", "unexercised_domain"]


class ProfileRun:
    """One profile × seed through the pipeline, as a sequence of steps (:meth:`steps`) that the
    driver interleaves with other profiles' steps."""

    def __init__(self, defn: SlotDef, cand: Candidate, profile: Profile, seed: int, runner: Runner, opts: VerifyOptions,
                 plan: CallPlan):
        self.defn, self.cand, self.profile, self.seed, self.runner, self.opts = defn, cand, profile, seed, runner, opts
        self.plan = plan
        self.device = torch.device(opts.device)
        self.result = new_result(defn, profile, seed, cand.name)
        self.performed: set[str] = set()

    def run(self) -> ProfileResult:
        for _ in self.steps():
            pass
        return self.result

    def steps(self) -> Iterator[None]:
        """Yield after each call of the plan; the result is final once the iterator is exhausted."""
        try:
            if self._setup():
                for call in self.plan.calls:
                    if not self._planned_call(call):
                        return
                    yield
                self._after_calls()
        finally:
            if not self.result.skipped_reason:
                self._finish()

    def admitted(self) -> bool:
        """Whether the candidate's domain admits this run (what :meth:`_setup` checks first)."""
        case = make_case(self.defn, self.profile, self.seed, 0)
        return self.cand.domain.matches(describe(self.defn, case, self.profile, self.opts.device))

    def _setup(self) -> bool:
        slot = self.defn.slot
        self.cpu_case = make_case(self.defn, self.profile, self.seed, 0)
        self.desc = describe(self.defn, self.cpu_case, self.profile, self.opts.device)
        if not self.cand.domain.matches(self.desc):
            self.result.skipped_reason = "outside declared domain: " + ", ".join(self.cand.domain.mismatches(self.desc))
            return False
        if why := self.runner.unavailable(self.cand.kernel):  # it failed to load or hung once: reported there
            self.result.skipped_reason = f"not run: {why}"
            return False
        self.case = case = self.runner.share(to_device(self.cpu_case, self.device))  # before any identity is recorded
        self.prepared = None
        self.prep_snap = snapshot(tensors_in(case.prepare_args))
        if slot.needs_prepare:
            try:
                self.prepared = self.runner.prepare(self.cand.kernel, case.prepare_args)
            except RunnerError as exc:
                self.result.record(exc.check, FAIL, traceback_summary(str(exc)))
                return False
            if not check_inputs(self.result, tensors_in(case.prepare_args), self.prep_snap, "prepare(): "):
                return False
            self.performed.add(Check.PREPARE)
        self.outputs = {n: allocate_output(spec, self.device) for n, spec in case.outputs.items() if spec is not None}
        self.runner.share([a.base for a in self.outputs.values()])
        self.args = self._args(case, self.outputs, self.prepared)
        self.ref_case = self.cpu_case  # the CPU image of what the live inputs (and the weights) hold now
        self._last: dict = {}  # the outputs the last successful call wrote (repeat and relation steps)
        return True

    def _planned_call(self, call: PlannedCall) -> bool:
        judge = None
        if call.refill == "reprepare":
            if not self._reprepare(call):
                return False
        elif call.refill == "repeat":
            judge = self._same_bits(self._last_outputs())
        elif call.refill == "relation":
            judge = self._relation(call)
        elif call.refill != "first":
            self.ref_case = refill_live(self.defn, self.profile, self.seed, call.draw, self.case, self.ref_case,
                                        call.refill, call.pick)
        if not call.plain:
            return self._one_call(call, self.outputs, self.args, judge=judge) is not None
        # The way an engine calls: plain contiguous outputs at offset 0, each cell a different random
        # value (no NaN, sentinel or padding to recognise), private tensors. Unwritten cells cannot be
        # told from results bit-exactly here, so this call is judged by the comparison alone.
        plain = {n: allocate_plain(spec, self.device) for n, spec in self.case.outputs.items() if spec is not None}
        self.runner.share([a.base for a in plain.values()])
        gen = torch.Generator().manual_seed(call.pick)
        for alloc in plain.values():
            alloc.poison_random(gen)
        plain_args = [plain[a.name].view if a.role is Role.OUTPUT and a.name in plain else v
                      for a, v in zip(self.defn.slot.args, self.args)]
        return self._one_call(call, plain, plain_args) is not None

    def _reprepare(self, call: PlannedCall) -> bool:
        """Reload the weights in place (fresh values of draw ``call.draw`` into the same storages), redraw
        the live inputs from the same draw, and ``prepare`` again; the next call uses the new result."""
        fresh = make_case(self.defn, self.profile, self.seed, call.draw)
        weights, new = tensors_in(self.case.prepare_args), tensors_in(fresh.prepare_args)
        if list(weights) != list(new) or any((t.shape, t.dtype) != (new[k].shape, new[k].dtype) for k, t in weights.items()):
            raise ValueError(f"{self.defn.name}/{self.profile.label}: make_case draws prepare arguments of other shapes "
                             "for another call id (a catalog defect: shapes must depend on the profile only)")
        for name, t in weights.items():
            t.copy_(new[name])
        live = self.case.live_names()
        for name in live:
            self.case.inputs[name].copy_(fresh.inputs[name])
        self.ref_case = dataclasses.replace(self.ref_case, inputs={**self.ref_case.inputs, **{n: fresh.inputs[n] for n in live}},
                                            prepare_args=fresh.prepare_args)
        self.prep_snap = snapshot(weights)
        try:
            self.prepared = self.runner.prepare(self.cand.kernel, self.case.prepare_args)
        except RunnerError as exc:
            self.result.record(Check.REPREPARE if exc.check == Check.PREPARE else exc.check, FAIL, call.label + traceback_summary(str(exc)))
            return False
        if not check_inputs(self.result, weights, self.prep_snap, "re-prepare(): "):
            return False
        self.args = self._args(self.case, self.outputs, self.prepared)
        return True

    def _last_outputs(self) -> dict[str, torch.Tensor]:
        """CPU copies of what the previous call wrote."""
        return {n: a.view.detach().cpu().clone() for n, a in self._last.items()}

    def _same_bits(self, before: dict[str, torch.Tensor]) -> Callable[[dict, str], bool]:
        """The ``determinism`` verdict of a repeated call: every output bitwise equal to the previous call's."""
        def judge(outputs: dict, label: str) -> bool:
            self.performed.add(Check.DETERMINISM)
            ok = True
            for name, alloc in outputs.items():
                now = alloc.view.detach().cpu()
                if not bits_equal(now, before[name]):
                    differ = (now.contiguous().view(torch.uint8) != before[name].contiguous().view(torch.uint8)).sum().item()
                    self.result.record(Check.DETERMINISM, FAIL, f"{label}{name}: {differ} byte(s) differ from the previous call on the "
                                       "same inputs; the freed memory of the allocators was filled with poison (NaN) before "
                                       "this call: does the kernel read scratch it never wrote?")
                    ok = False
            return ok
        return judge

    def _relation(self, call: PlannedCall) -> Callable[[dict, str], bool]:
        """Transform the previous call's inputs in place by the slot's relation ``call.relation``; the
        ``metamorphic`` verdict: the new outputs equal the previous ones transformed, within the comparator."""
        relation = self.defn.relations[call.relation]
        before = self._last_outputs()
        current = {n: v for n, v in self.ref_case.inputs.items() if isinstance(v, torch.Tensor)}
        changed, outputs_map, drawn = relation.transform(current, random.Random(call.pick))
        for name, value in changed.items():
            self.case.inputs[name].copy_(value)
        self.ref_case = dataclasses.replace(self.ref_case, inputs={**self.ref_case.inputs, **changed})
        want = outputs_map(before)

        def judge(outputs: dict, label: str) -> bool:
            self.performed.add(Check.METAMORPHIC)
            ok = True
            for name, expected in want.items():
                verdict = self.defn.comparator_for(name, self.profile).compare(outputs[name].view.detach().cpu(), expected.float())
                if not verdict.passed:
                    self.result.record(Check.METAMORPHIC, FAIL, f"{label}{name} against the previous call's {name} transformed "
                                       f"({relation.describe()}; {drawn}): {verdict.describe()}")
                    ok = False
            return ok
        return judge

    def _after_calls(self) -> None:
        if self.device.type == "cuda" and self.opts.graph and self.cand.graph_safe and self.runner.in_process:
            from kernelslot.verify.single.graph import graph_replay  # CUDA only: imported when captured (in-process runner only)

            graph_replay(self, self.case, self.ref_case, self.outputs, self.args, self.prepared)
        if self.plan.timing is not None and not self.result.failures():
            self._time(self.plan.timing)

    def _time(self, plan: TimingPlan) -> None:
        """Candidate and incumbent side by side (verify/single/timed.py); every timed call is checked."""
        from kernelslot.verify.single.timed import time_profile

        time_profile(self, plan)

    def _args(self, case: Case, outputs: dict, prepared: Any) -> list[Any]:
        def other(a: Arg) -> Any:
            if a.role is not Role.PREPARED:
                raise RunnerError(f"slot {self.defn.name}: argument {a.name} ({a.role.value}) needs the collective referee")
            return prepared
        return call_args(self.defn, case.inputs, outputs, other)

    def expected(self, ref_case: Case) -> dict[str, Any]:
        """The reference outputs: a tensor, or an admissible set (``abi.comparators.Admissible``) per output."""
        return self.defn.reference(clone_case(ref_case))

    def compare(self, outputs: dict, expected: dict, label: str, check: str, ref_case: Case | None = None) -> bool:
        ok = True
        for out_name, alloc in outputs.items():
            actual = alloc.view.detach().cpu()
            want = resolve_expected(expected[out_name], actual)
            verdict = self.defn.comparator_for(out_name, self.profile).compare(actual, want)
            key = f"{out_name}.{verdict.metric}"
            self.result.metrics[key] = min(self.result.metrics.get(key, verdict.value), verdict.value)  # worst call
            if not verdict.passed:
                near = None if self.result.failures() else (  # the first failure only: near-misses cost references
                    self.defn.near_miss_matching(clone_case(ref_case or self.ref_case), out_name, actual, self.profile))
                why = f"; it matches the reference with {near}" if near else ""  # the slot's named mistake
                self.result.record(check, FAIL, f"{label}{out_name}: {verdict.describe()}{why}")
                ok = False
        return ok

    def audit(self, case: Case, outputs: dict, label: str) -> bool:
        if self.defn.audit is None:
            return True
        problems = self.defn.audit(case, {n: a.view.detach().cpu() for n, a in outputs.items()})
        if problems:
            self.result.record(Check.AUDIT, FAIL, label + "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""))
        return not problems

    def _one_call(self, call: PlannedCall, outputs: dict, args: list, label: str | None = None,
                  judge: Callable[[dict, str], bool] | None = None) -> CallObservation | None:
        """Make ``call`` on the inputs the case holds now and check it; its observation, or None on a failure.
        ``judge(outputs, label)``: the verdict of a state step (determinism, metamorphic), made before the comparison."""
        armed = self._arm(call, self.case, outputs)
        obs = self.runner.call(self.cand.kernel, args, **({"private": True} if call.private else {}),
                               **({"scratch": True} if call.scratch else {}))
        return obs if self._judge(call, obs, self.case, self.ref_case, outputs, armed, label, judge) else None

    def _arm(self, call: PlannedCall, case: Case, outputs: dict) -> tuple[dict, dict]:
        """Before a call: the inputs' snapshot, the outputs poisoned (not a plain call's) and their identities."""
        in_snap = snapshot(case.inputs)
        if not call.plain:
            for alloc in outputs.values():
                alloc.poison(finite=call.poison == "sentinel")
        return in_snap, {n: TensorMeta.of(a.view) for n, a in outputs.items()}

    def _judge(self, call: PlannedCall, obs: CallObservation, case: Case, ref_case: Case, outputs: dict,
               armed: tuple[dict, dict], label: str | None = None, judge: Callable[[dict, str], bool] | None = None) -> bool:
        """Every check of one call made on ``case`` (whose reference inputs are ``ref_case``); True when all passed."""
        label = call.label if label is None else label
        in_snap, out_meta = armed
        input_meta = {k: m for k, (_, m) in in_snap.items()}
        self.performed.add(Check.INPUT_MUTATED)
        inputs_ok = check_inputs(self.result, case.inputs, in_snap, label)
        inputs_ok &= check_inputs(self.result, tensors_in(case.prepare_args), self.prep_snap, label + "weights: ")
        expected = self.expected(ref_case)  # only after the call: nothing to find while it runs
        # a call that never ran checks nothing; both runners compare the numeric state around every call
        self.performed.update(CALL_CHECKS + (Check.GLOBAL_STATE_CHANGED,) if obs.error is None else (Check.RAISED,))
        # a state step's verdict first: NaN from poisoned scratch in an output is its finding, not only poison_left
        judged = judge(outputs, label) if judge is not None and obs.error is None else True
        usable = check_call(self.result, obs, [a.name for a in self.defn.slot.args], list(outputs), outputs, out_meta,
                            input_meta, label)
        if not usable:
            return False
        # the plain and timed calls are replays too; a re-prepared call's comparison is its own check
        check = Check.REPREPARE if call.refill == "reprepare" else Check.REPLAY if call.draw else Check.COMPARE
        self.performed.add(check)
        compared = self.compare(outputs, expected, label, check, ref_case)
        if self.defn.audit is not None:
            self.performed.add(Check.AUDIT)
        audited = self.audit(ref_case, outputs, label)
        if not (inputs_ok and judged and compared and audited and not self.result.failures()):
            return False
        self._last = outputs
        return True

    def _finish(self) -> None:
        """Every check not failed is recorded as passed if it was made, else skipped with why."""
        why_not = "not reached (an earlier check failed)" if self.result.failures() else "not reached"
        graph_why = ("no CUDA device" if self.device.type != "cuda" else "not graph_safe" if not self.cand.graph_safe
                     else f"not run under the {self.runner.name} runner (capture would run candidate code in the referee)"
                     if not self.runner.in_process else why_not)
        finish_checks(self.result, self.performed, self.defn, graph_why, why_not=why_not,
                      omitted=frozenset({Check.TIME_IMPOSSIBLE}) if self.plan.timing is None else frozenset())


def plan_for(defn: SlotDef, planner: Planner) -> CallPlan:
    """A call plan for one profile run of ``defn``, with the state steps the slot takes (verify/plan.py)."""
    return planner.plan(reprepare=defn.slot.needs_prepare, repeat=True, relations=len(defn.relations))


def verify_single(
    defn: SlotDef,
    candidates: Candidate | Sequence[Candidate],
    opts: VerifyOptions = VerifyOptions(),
    runner: Runner | None = None,
    progress: Progress | None = None,
) -> SlotReport:
    """Verify one slot's candidate variants on every selected profile and seed.

    Each profile is routed to the single variant whose domain matches its descriptor;
    profiles no variant accepts are reported as skipped. A slot none of whose profiles reached
    a candidate fails: a domain that is never exercised earns nothing. The calls of all
    profile runs are interleaved in an order drawn by the call plan (``verify/plan.py``).
    """
    if defn.slot.kind is SlotKind.COLLECTIVE:
        raise ValueError(f"{defn.name} is a collective slot: verify it with kernelslot.verify.verify_slot "
                         "(verify/referee.py), which runs the multi-process referee")
    cands = [candidates] if isinstance(candidates, Candidate) else list(candidates)
    runner = runner or InProcessRunner()
    report = SlotReport(defn.name, ", ".join(c.name for c in cands), runner.name, opts.device)
    models = [opts.model] if opts.model else sorted({c.model for c in cands if c.model}) or [None]
    planner = planner_for(opts)
    selected = [p for m in models for p in select_profiles(defn, opts, m)]  # each variant's bound model
    runs = [_routed(defn, cands, profile, seed, runner, opts, planner) for profile, seed in profile_runs(defn, selected, opts)]
    live = [r for r in runs if isinstance(r, ProfileRun)]
    if (long := planner.lengthen_one([r.plan for r in live], lambda i: live[i].admitted())) is not None:
        live[long[0]].plan = long[1]  # the secret long run (verify/plan.py), among the runs the domain admits
    report.results = [r.result if isinstance(r, ProfileRun) else r for r in runs]
    _drive(runs, planner, progress)
    if opts.envelope and report.results:
        _verify_envelope(defn, cands, runs, runner, opts, planner, report, progress)
    if not report.results:
        report.errors.append("no profile selected (check --dtype/--model/--profile filters)")
    elif all(r.skipped_reason for r in report.results):
        report.errors.append("no profile falls inside any declared domain: the candidate was never exercised")
    else:
        report.errors.extend(p for c in cands for p in unexercised_domain(defn, c, report.results, opts))
    return report


def _drive(runs: list, planner: Planner, progress: Progress | None) -> None:
    """Run every profile run to its end, one call at a time, in an order the planner draws."""
    steps = {i: r.steps() for i, r in enumerate(runs) if isinstance(r, ProfileRun)}
    for r in runs:
        if progress and not isinstance(r, ProfileRun):
            progress(r)
    while steps:
        i = planner.pick(sorted(steps))
        if next(steps[i], StopIteration) is StopIteration:
            del steps[i]
            if progress:
                progress(runs[i].result)


def _verify_envelope(defn: SlotDef, cands: list[Candidate], runs: list, runner: Runner, opts: VerifyOptions,
                     planner: Planner, report: SlotReport, progress: Progress | None) -> None:
    """Run each variant's boundary profiles (``verify/envelope.py``) and record its verified envelope."""
    for cand in cands:
        mine = [r for r in runs if isinstance(r, ProfileRun) and r.cand is cand and not r.result.skipped_reason]
        if not mine:
            continue
        clipped: dict[str, str] = {}
        fixed = [(r.profile, r.desc) for r in mine if r.profile.drawn is None]  # boundaries grow from fixed profiles
        extra = boundary_profiles(defn, cand, fixed, opts.envelope_max_bytes,
                                  lambda p: make_case(defn, p, opts.seeds[0], 0), clipped, opts.envelope_fields)
        light = Planner(2, 0.0, None, opts.plan_seed)  # a boundary checks a size: first call, 2 replays, the plain call
        more = [ProfileRun(defn, cand, b.profile, opts.seeds[0], runner, opts, light.plan()) for b in extra]
        report.results.extend(r.result for r in more)
        _drive(more, planner, progress)
        passed = [r.desc for r in mine + more if r.result.passed]
        report.envelope[cand.name] = verified_envelope(passed)
        report.notes.extend(f"{cand.name}: {why}" for why in clipped.values())


VERIFIED_DTYPES = ("float32", "bfloat16", "float16")


def _admits(cand: Candidate, field: str, value: str) -> bool:
    probe = CallDescriptor(**{field: value})
    return all(p.matches(probe) for p in cand.domain.predicates if p.field == field)


def unexercised_domain(defn: SlotDef, cand: Candidate, results: list[ProfileResult], opts: VerifyOptions) -> list[str]:
    """What ``cand``'s domain admits that no profile run exercised: a pass covers only what ran.

    Every admitted dtype (of float32/bfloat16/float16) must have run, and every model the slot
    has profiles for that the domain admits (unless ``--model`` chose one explicitly); otherwise
    live routing would send the candidate calls nobody verified.
    """
    ran = [r for r in results if r.kernel == cand.name and not r.skipped_reason]
    if not ran:
        hint = "; --profile/--dtype/--model selected none of its profiles: widen them to verify it" if (
            opts.profiles or opts.dtypes or opts.model) else ""
        return [f"{cand.name}: no profile reached this variant (its domain {cand.domain.describe()} is never exercised{hint})"]
    problems = []
    if opts.dtypes is None and opts.profiles is None:
        missing = [d for d in VERIFIED_DTYPES if _admits(cand, "dtype", d) and d not in {r.dtype for r in ran}]
        if missing:
            problems.append(f"{cand.name}: its domain admits dtype {', '.join(missing)} but no profile exercised it; "
                            f"declare `dtypes` to what was verified ({', '.join(sorted({r.dtype for r in ran}))})")
    if opts.model is None and opts.profiles is None:
        models = sorted({p.model for p in defn.profiles} - {r.model for r in ran})
        missing = [m for m in models if _admits(cand, "model", m)]
        if missing:
            problems.append(f"{cand.name}: its domain admits model {', '.join(missing)} but those profiles did not run "
                            f"(bundle metadata selects {cand.model or 'none'}); add "
                            f"`model = {{ exact = \"{cand.model or ran[0].model}\" }}` to its domain")
    return problems


def _routed(defn: SlotDef, cands: list[Candidate], profile: Profile, seed: int, runner: Runner, opts: VerifyOptions,
            planner: Planner) -> "ProfileRun | ProfileResult":
    """The profile run of the variant whose domain covers ``profile`` (else a skipped result); a
    single variant always runs, and its own domain check skips the profile with the mismatches."""
    cand, skipped = (cands[0], "") if len(cands) == 1 else route(defn, cands, profile, seed, opts.device)
    if cand is not None:
        return ProfileRun(defn, cand, profile, seed, runner, opts, plan_for(defn, planner))
    res = new_result(defn, profile, seed, "-")
    res.skipped_reason = skipped
    return res
