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
    the caller) reuses rank processes across slots, for trusted kernels only (the built-ins). Variants this machine cannot run (``Candidate.needs``)
    are left out; when none can run, the report's status is ``not run`` with the reason.
    """
    cands = [candidates] if isinstance(candidates, Candidate) else list(candidates)
    unmet = [c.needs.unmet(device_arch(opts.device)) for c in cands]
    if all(unmet):  # this machine cannot run any variant: not run, never a failure of the candidate
        return SlotReport(defn.name, ", ".join(c.name for c in cands), runner.name if runner else "-", opts.device,
                          not_run="; ".join(dict.fromkeys(u for u in unmet if u)))
    left_out = [f"{c.name}: not run: {u}" for c, u in zip(cands, unmet) if u]
    cands = [c for c, u in zip(cands, unmet) if not u]
    report = WINGS.get(defn.slot.kind, _single)(defn, cands, opts, runner, progress, sessions)
    if left_out:  # the other variants' verdicts stand; these were never exercised
        report.notes.extend(left_out)
    return report
