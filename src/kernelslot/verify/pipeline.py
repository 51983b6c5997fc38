"""The referee's pipeline (docs/referee.md): inputs → reference → outputs → poison → call →
checks → compare → replay → (CUDA graph replay) → receipt, for every profile and seed.

References always run on the CPU, on clones, in this process; the candidate runs through a
:class:`~kernelslot.verify.runner.Runner`. Nothing the candidate does can raise out of here:
every failure becomes a named check in the :class:`ProfileResult`.
"""
from __future__ import annotations

import copy
import dataclasses
import secrets
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from kernelslot.abi import Role, SlotKind, allocate_output
from kernelslot.abi.tensor_spec import allocate_plain
from kernelslot.abi.capability import CallDescriptor
from kernelslot.slots.base import Candidate, Case, Profile, SlotDef, dtype_name
from kernelslot.verify.checks import check_call, check_inputs, snapshot
from kernelslot.verify.report import CHECKS, FAIL, PASS, SKIP, ProfileResult, SlotReport
from kernelslot.verify.runner import InProcessRunner, Runner, RunnerError, TensorMeta

Progress = Callable[[ProfileResult], None]
_CALL_CHECKS = ("raised", "returned_value", "input_mutated", "output_storage_swapped", "output_aliases_input",
                "poison_left", "out_of_bounds_write", "retained_tensor")


@dataclass(frozen=True)
class VerifyOptions:
    device: str = "cpu"
    dtypes: tuple[torch.dtype, ...] | None = None  # None: every dtype the slot's profiles take
    seeds: tuple[int, ...] = (0,)
    replays: int = 3  # fresh-input replays after the first call (at least two): full, tail, head refills
    extra_replays: int = 0  # up to this many more, drawn per profile from an unseeded RNG (untrusted bundles)
    profiles: tuple[str, ...] | None = None  # profile-name filter
    model: str | None = None  # run this model's profiles (falls back to generic where the slot has none)
    graph: bool = True  # CUDA-graph replay for graph_safe candidates on CUDA
    time: bool = False  # time candidate and incumbent side by side
    time_reps: int = 7
    world_sizes: tuple[int, ...] = (2,)  # collective slots: group sizes to verify (profiles carry dims["world"])
    collective_timeout_s: float = 30.0  # collective slots: per-call deadline for every rank


def device_arch(device: str) -> str:
    """The canonical architecture of ``device`` (``cpu``, ``sm_90``, ...; see abi.canonical_arch)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return f"sm_{major}{minor}"
    return dev.type


def select_profiles(defn: SlotDef, opts: VerifyOptions, model: str | None) -> list[Profile]:
    """The slot's profiles for ``model``: its own, else the generic ones run with ``model``'s
    semantics (a slot without model-specific profiles judges every model alike)."""
    profiles = list(defn.profiles)
    if model is not None:
        own = [p for p in profiles if p.model == model]
        profiles = own or [dataclasses.replace(p, model=model) for p in profiles if p.model == "generic"]
    if opts.dtypes is not None:
        profiles = [p for p in profiles if p.dtype in opts.dtypes]
    if opts.profiles is not None:
        profiles = [p for p in profiles if p.name in opts.profiles]
    return profiles


def case_seed(profile: Profile, seed: int, call: int) -> int:
    return (zlib.crc32(profile.label.encode()) + 1_000_003 * seed + 7919 * call) % (2**63)


def make_case(defn: SlotDef, profile: Profile, seed: int, call: int) -> Case:
    gen = torch.Generator().manual_seed(case_seed(profile, seed, call))
    return defn.make_case(profile, gen)


def to_device(obj: Any, device: torch.device) -> Any:
    """Copy the tensors inside ``obj`` (tuples, lists, dicts, dataclasses) to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, copy=True)  # never the referee's own CPU image, even on the CPU
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init})
    return obj


def tensors_in(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor reachable in ``obj``, by a dotted path (for bit-exact mutation checks)."""
    found: dict[str, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        found[prefix or "value"] = obj
    elif isinstance(obj, (list, tuple)):
        for i, o in enumerate(obj):
            found.update(tensors_in(o, f"{prefix}[{i}]"))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            found.update(tensors_in(v, f"{prefix}.{k}" if prefix else str(k)))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            found.update(tensors_in(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name))
    return found


def clone_case(case: Case) -> Case:
    """A deep copy for the reference: the reference never sees the candidate's tensors."""
    return Case(
        inputs={k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in case.inputs.items()},
        outputs=dict(case.outputs),
        prepare_args=copy.deepcopy(case.prepare_args),
        live=case.live,
        meta=copy.deepcopy(case.meta),
    )


def describe(defn: SlotDef, case: Case, profile: Profile, device: str) -> CallDescriptor:
    desc = defn.describe(case)
    first = next((case.inputs[a.name] for a in defn.slot.args if isinstance(case.inputs.get(a.name), torch.Tensor)), None)
    return dataclasses.replace(desc, arch=device_arch(device), dtype=dtype_name(profile.dtype), model=profile.model,
                               last_dim=first.shape[-1] if first is not None and first.dim() else None)


REFILL_SCHEDULE = ("full", "tail", "head")  # replay r uses REFILL_SCHEDULE[(r - 1) % 3]


def refill_live(defn: SlotDef, profile: Profile, seed: int, call: int, case: Case, prev: Case, mode: str = "full") -> Case:
    """Refill the live inputs of ``case`` in place (same storage) and return the CPU case they now hold.

    ``full`` redraws every live input. ``tail`` / ``head`` redraw only the trailing / leading
    half (in memory order) of the floating-point live inputs and keep everything else (integer
    inputs included), so a kernel that memoises on a fingerprint of a few cells at either end
    of an input returns stale data on one of them.
    """
    fresh = make_case(defn, profile, seed, call)
    now = {name: refilled(prev.inputs[name], fresh.inputs[name], mode) for name in case.live_names()}
    for name, value in now.items():
        case.inputs[name].copy_(value)
    return dataclasses.replace(prev, inputs={**prev.inputs, **now})


def refilled(old: torch.Tensor, new: torch.Tensor, mode: str) -> torch.Tensor:
    """The value a live input takes under refill ``mode`` (see :func:`refill_live`)."""
    if mode == "full":
        return new
    if not new.dtype.is_floating_point:
        return old
    mixed = old.clone().contiguous()
    half = mixed.numel() // 2
    region = slice(half, None) if mode == "tail" else slice(0, half)
    mixed.view(-1)[region] = new.contiguous().view(-1)[region]
    return mixed


class _ProfileRun:
    """One profile × seed through the pipeline."""

    def __init__(self, defn: SlotDef, cand: Candidate, profile: Profile, seed: int, runner: Runner, opts: VerifyOptions):
        self.defn, self.cand, self.profile, self.seed, self.runner, self.opts = defn, cand, profile, seed, runner, opts
        self.device = torch.device(opts.device)
        self.result = ProfileResult(defn.name, profile.name, dtype_name(profile.dtype), profile.model, seed, cand.name)
        self.performed: set[str] = set()

    def run(self) -> ProfileResult:
        slot = self.defn.slot
        cpu_case = make_case(self.defn, self.profile, self.seed, 0)
        desc = describe(self.defn, cpu_case, self.profile, self.opts.device)
        if not self.cand.domain.matches(desc):
            self.result.skipped_reason = "outside declared domain: " + ", ".join(self.cand.domain.mismatches(desc))
            return self.result
        if why := self.runner.unavailable(self.cand.kernel):  # it failed to load or hung once: reported there
            self.result.skipped_reason = f"not run: {why}"
            return self.result
        case = self.runner.share(to_device(cpu_case, self.device))  # before any identity is recorded
        prepared = None
        prep_snap = snapshot(tensors_in(case.prepare_args))
        if slot.needs_prepare:
            try:
                prepared = self.runner.prepare(self.cand.kernel, case.prepare_args)
            except RunnerError as exc:
                self.result.record("prepare", FAIL, str(exc))
                return self._finish()
            if not check_inputs(self.result, tensors_in(case.prepare_args), prep_snap, "prepare(): "):
                return self._finish()
            self.performed.add("prepare")
        outputs = {n: allocate_output(spec, self.device) for n, spec in case.outputs.items() if spec is not None}
        self.runner.share([a.base for a in outputs.values()])
        args = self._args(case, outputs, prepared)
        arg_names = [a.name for a in slot.args]
        ref_case = cpu_case  # the CPU image of what the live inputs hold now
        replays = self.opts.replays + (secrets.randbelow(self.opts.extra_replays + 1) if self.opts.extra_replays else 0)
        for call in range(1 + replays):
            if call:
                mode = REFILL_SCHEDULE[(call - 1) % len(REFILL_SCHEDULE)]
                ref_case = refill_live(self.defn, self.profile, self.seed, call, case, ref_case, mode)
            if not self._one_call(call, case, ref_case, outputs, args, arg_names, prep_snap):
                return self._finish()
        if not self._plain_call(case, ref_case, args, arg_names, prep_snap):
            return self._finish()
        if self.device.type == "cuda" and self.opts.graph and self.cand.graph_safe and self.runner.in_process:
            from kernelslot.verify.graph import graph_replay  # captures in this process: in-process runner only

            graph_replay(self, case, cpu_case, outputs, args, prepared)
        if self.opts.time:
            from kernelslot.bench.timing import time_side_by_side

            timed: dict[str, Case] = {}

            def refill(rep: int) -> None:  # fresh inputs and fresh poison before every timed call
                timed["case"] = refill_live(self.defn, self.profile, self.seed, 1000 + rep, case, cpu_case)
                for alloc in outputs.values():
                    alloc.poison()

            def check_timed() -> None:  # the last timed call must have done the work it was timed for
                if "case" in timed:
                    self.compare(outputs, self.expected(timed["case"]), "timed call: ", "replay")

            try:
                self.result.timing = time_side_by_side(self.defn, self.cand, self.runner, case, prepared, args, self.opts.time_reps,
                                                       refill=refill, incumbent=self.defn.incumbent_for(desc),
                                                       check_candidate=check_timed)
            except RunnerError as exc:
                self.result.record("raised", FAIL, f"timing: {exc}")
        return self._finish()

    def _args(self, case: Case, outputs: dict, prepared: Any) -> list[Any]:
        args = []
        for a in self.defn.slot.args:
            if a.role in (Role.INPUT, Role.SCALAR):
                args.append(case.inputs[a.name])
            elif a.role is Role.OUTPUT:
                args.append(outputs[a.name].view if a.name in outputs else None)
            elif a.role is Role.PREPARED:
                args.append(prepared)
            else:
                raise RunnerError(f"slot {self.defn.name}: argument {a.name} ({a.role.value}) needs the collective referee")
        return args

    def expected(self, ref_case: Case) -> dict[str, torch.Tensor]:
        return self.defn.reference(clone_case(ref_case))

    def compare(self, outputs: dict, expected: dict, label: str, check: str) -> bool:
        ok = True
        for out_name, alloc in outputs.items():
            verdict = self.defn.comparator_for(out_name, self.profile).compare(alloc.view.detach().cpu(), expected[out_name])
            key = f"{out_name}.{verdict.metric}"
            self.result.metrics[key] = min(self.result.metrics.get(key, verdict.value), verdict.value)  # worst call
            if not verdict.passed:
                self.result.record(check, FAIL, f"{label}{out_name}: {verdict.describe()}")
                ok = False
        return ok

    def audit(self, case: Case, outputs: dict, label: str) -> bool:
        if self.defn.audit is None:
            return True
        problems = self.defn.audit(case, {n: a.view.detach().cpu() for n, a in outputs.items()})
        if problems:
            self.result.record("audit", FAIL, label + "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""))
        return not problems

    def _one_call(self, call: int, case: Case, ref_case: Case, outputs: dict, args: list, arg_names: list, prep_snap: dict,
                  poison: bool = True) -> bool:
        """Call ``call`` (0 = first, > 0 = replay, -1 = the plain engine-like call) and check it."""
        label = "plain-output call: " if call < 0 else f"replay {call}: " if call else ""
        in_snap = snapshot(case.inputs)
        input_meta = {k: m for k, (_, m) in in_snap.items()}
        for alloc in outputs.values() if poison else ():
            alloc.poison(finite=call == 1)  # the first replay uses a finite sentinel, the others NaN
        out_meta = {n: TensorMeta.of(a.view) for n, a in outputs.items()}
        obs = self.runner.call(self.cand.kernel, args)
        inputs_ok = check_inputs(self.result, case.inputs, in_snap, label)
        inputs_ok &= check_inputs(self.result, tensors_in(case.prepare_args), prep_snap, label + "weights: ")
        expected = self.expected(ref_case)  # only after the call: nothing to find while it runs
        self.performed.update(_CALL_CHECKS)
        usable = check_call(self.result, obs, arg_names, list(outputs), outputs, out_meta, input_meta, label)
        if not usable:
            return False
        check = "replay" if call else "compare"  # the plain call (-1) is a replay too
        self.performed.add(check)
        compared = self.compare(outputs, expected, label, check)
        if self.defn.audit is not None:
            self.performed.add("audit")
        audited = self.audit(ref_case, outputs, label)
        return inputs_ok and compared and audited and not self.result.failures()

    def _plain_call(self, case: Case, prev: Case, args: list, arg_names: list, prep_snap: dict) -> bool:
        """One more call the way an engine makes it: plain contiguous outputs at offset 0, each
        cell filled with a different random value (no NaN, no sentinel, no padding to recognise),
        on freshly drawn inputs. A kernel that is honest only when it detects the harness fails."""
        plain = {n: allocate_plain(spec, self.device) for n, spec in case.outputs.items() if spec is not None}
        self.runner.share([a.base for a in plain.values()])
        gen = torch.Generator().manual_seed(secrets.randbits(63))
        for alloc in plain.values():
            alloc.poison_random(gen)
        ref_case = refill_live(self.defn, self.profile, self.seed, 500, case, prev)
        plain_args = [plain[a.name].view if a.role is Role.OUTPUT and a.name in plain else v
                      for a, v in zip(self.defn.slot.args, args)]
        return self._one_call(-1, case, ref_case, plain, plain_args, arg_names, prep_snap, poison=False)

    def _finish(self) -> ProfileResult:
        """Every check not failed is recorded as passed if it was made, else skipped with why."""
        failed = {c.name for c in self.result.failures()}
        for name in CHECKS:
            if name in failed:
                continue
            if name in self.performed:
                self.result.record(name, PASS)
            elif name == "graph_replay":
                why = ("no CUDA device" if self.device.type != "cuda" else "not graph_safe" if not self.cand.graph_safe
                       else f"not run under the {self.runner.name} runner (capture would run candidate code in the referee)"
                       if not self.runner.in_process else "not reached")
                self.result.record(name, SKIP, why)
            elif (name == "prepare" and not self.defn.slot.needs_prepare) or (name == "audit" and self.defn.audit is None):
                continue
            else:
                self.result.record(name, SKIP, "not reached")
        return self.result


def verify_slot(
    defn: SlotDef,
    candidates: Candidate | Sequence[Candidate],
    opts: VerifyOptions = VerifyOptions(),
    runner: Runner | None = None,
    progress: Progress | None = None,
) -> SlotReport:
    """Verify one slot's candidate variants on every selected profile and seed.

    Each profile is routed to the single variant whose domain matches its descriptor;
    profiles no variant accepts are reported as skipped. A slot none of whose profiles reached
    a candidate fails: a domain that is never exercised earns nothing.
    """
    if defn.slot.kind is SlotKind.COLLECTIVE:
        raise ValueError(f"{defn.name} is a collective slot: verify it with kernelslot.verify.verify_slot "
                         "(verify/referee.py), which runs the multi-process referee")
    cands = [candidates] if isinstance(candidates, Candidate) else list(candidates)
    runner = runner or InProcessRunner()
    report = SlotReport(defn.name, ", ".join(c.name for c in cands), runner.name, opts.device)
    models = [opts.model] if opts.model else sorted({c.model for c in cands if c.model}) or [None]
    for profile in [p for m in models for p in select_profiles(defn, opts, m)]:  # each variant's bound model
        for seed in opts.seeds:
            result = _run_routed(defn, cands, profile, seed, runner, opts)
            report.results.append(result)
            if progress:
                progress(result)
    if not report.results:
        report.errors.append("no profile selected (check --dtype/--model/--profile filters)")
    elif all(r.skipped_reason for r in report.results):
        report.errors.append("no profile falls inside any declared domain: the candidate was never exercised")
    else:
        report.errors.extend(p for c in cands for p in unexercised_domain(defn, c, report.results, opts))
    return report


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
        return [f"{cand.name}: no profile reached this variant (its domain {cand.domain.describe()} is never exercised)"]
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


def _run_routed(defn: SlotDef, cands: list[Candidate], profile: Profile, seed: int, runner: Runner, opts: VerifyOptions) -> ProfileResult:
    if len(cands) == 1:
        return _ProfileRun(defn, cands[0], profile, seed, runner, opts).run()
    desc = describe(defn, make_case(defn, profile, seed, 0), profile, opts.device)
    for cand in cands:
        if cand.domain.matches(desc):
            return _ProfileRun(defn, cand, profile, seed, runner, opts).run()
    res = ProfileResult(defn.name, profile.name, dtype_name(profile.dtype), profile.model, seed, "-")
    res.skipped_reason = "outside every variant's domain (the incumbent runs)"
    return res
