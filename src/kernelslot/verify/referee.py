"""The referee's front door: verify one slot, dispatched by slot kind.

Each slot kind has one wing (:data:`WINGS`): collective slots (``SlotKind.COLLECTIVE``) go to
the multi-process referee (:mod:`kernelslot.verify.collective.referee`), every other kind to the
single-device pipeline (:mod:`kernelslot.verify.single.pipeline`). The dependency runs one way:
this module uses both wings, the wings share ``cases``, ``plan`` and ``checks``, and neither
knows the other.
"""
from __future__ import annotations

from typing import Callable, Sequence

from kernelslot.abi import SlotKind
from kernelslot.isolation.runner import Runner
from kernelslot.slots.base import Candidate, SlotDef
from kernelslot.verify.interpreted import verify_interpreted, why_not_interpreted
from kernelslot.verify.options import Progress, VerifyOptions, device_arch
from kernelslot.verify.verdict import SlotReport

__all__ = ["verify_slot", "WINGS"]


def _single(defn: SlotDef, cands: list[Candidate], opts: VerifyOptions, runner: Runner | None,
            progress: Progress | None, sessions: dict | None) -> SlotReport:
    from kernelslot.verify.single.pipeline import verify_single

    return verify_single(defn, cands, opts, runner, progress)


def _collective(defn: SlotDef, cands: list[Candidate], opts: VerifyOptions, runner: Runner | None,
                progress: Progress | None, sessions: dict | None) -> SlotReport:
    from kernelslot.verify.collective.referee import verify_collective  # spawns rank processes: imported when needed

    return verify_collective(defn, cands, opts, progress, sessions=sessions)


# slot kind -> wing(defn, candidates, opts, runner, progress, sessions); kinds not listed run single-device
WINGS: dict[SlotKind, Callable[..., SlotReport]] = {SlotKind.COLLECTIVE: _collective}


def verify_slot(defn: SlotDef, candidates: Candidate | Sequence[Candidate], opts: VerifyOptions = VerifyOptions(),
                runner: Runner | None = None, progress: Progress | None = None, sessions: dict | None = None) -> SlotReport:
    """Verify one slot's candidate variants on every selected profile and seed.

    Collective slots run in rank processes of their own, isolated whatever ``runner`` is (it
    applies to single-device slots only); ``sessions`` (group size -> running session, closed by
    the caller) reuses rank processes across slots, for trusted kernels only (the built-ins). Variants this
    machine cannot run (``Candidate.needs``) are left out, except bundle rows with Triton kernels on a
    CPU, which run under Triton's interpreter (``verify/interpreted.py``; their verdict says so); when
    none can run, the report's status is ``not run`` with the reason.
    """
    cands = [candidates] if isinstance(candidates, Candidate) else list(candidates)
    arch = device_arch(opts.device)
    native, interpreted, left_out = [], [], []
    for c in cands:
        why = c.needs.unmet(arch)
        if why is not None and defn.slot.kind is not SlotKind.COLLECTIVE:
            why = why_not_interpreted(c.needs, arch, why)
            if why is None:
                interpreted.append(c)
                continue
        (native if why is None else left_out).append((c, why))
    wing = WINGS.get(defn.slot.kind, _single)
    report = wing(defn, [c for c, _ in native], opts, runner, progress, sessions) if native else None
    tried = verify_interpreted(defn, interpreted, opts, runner, progress, wing) if interpreted else []
    unmet = [(c.name, w) for c, w in left_out] + [(p.kernel, p.not_run) for p in tried if p.not_run]
    judged = ([report] if report is not None else []) + [p for p in tried if not p.not_run]
    if not judged:  # this machine cannot run any variant: not run, never a failure of the candidate
        return SlotReport(defn.name, ", ".join(c.name for c in cands), runner.name if runner else "-", opts.device,
                          not_run="; ".join(dict.fromkeys(w for _, w in unmet)), evidence=tried[0].evidence if tried else "")
    report = _merged(judged)
    if unmet:  # the other variants' verdicts stand; these were never exercised
        report.notes.extend(f"{name}: not run: {why}" for name, why in unmet)
    return report


def _merged(parts: list[SlotReport]) -> SlotReport:
    """One slot's reports (natively run variants, interpreted groups) as one: results, errors,
    envelopes and notes together; the evidence of each part that has one, by variant where mixed."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    evidence = [p for p in parts if p.evidence]
    report = SlotReport(first.slot, ", ".join(p.kernel for p in parts), first.runner, first.device,
                        evidence="; ".join(f"{p.kernel}: {p.evidence}" for p in evidence)
                        if len(evidence) < len(parts) or len({p.evidence for p in parts}) > 1 else first.evidence)
    for p in parts:
        report.results += p.results
        report.errors += p.errors
        report.envelope.update(p.envelope)
        report.notes += p.notes
    return report
