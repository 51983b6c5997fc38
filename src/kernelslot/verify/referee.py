"""The referee's front door: verify one slot, dispatched by slot kind.

Collective slots (``SlotKind.COLLECTIVE``) go to the multi-process referee
(:mod:`kernelslot.verify.collective`), every other slot to the single-device pipeline
(:mod:`kernelslot.verify.pipeline`). The dependency runs one way: this module uses both, the
collective referee uses the pipeline's helpers, and the pipeline knows nothing of collectives.
"""
from __future__ import annotations

from typing import Sequence

from kernelslot.abi import SlotKind
from kernelslot.slots.base import Candidate, SlotDef
from kernelslot.verify import pipeline
from kernelslot.verify.pipeline import Progress, VerifyOptions
from kernelslot.verify.report import SlotReport
from kernelslot.verify.runner import Runner

__all__ = ["verify_slot"]


def verify_slot(defn: SlotDef, candidates: Candidate | Sequence[Candidate], opts: VerifyOptions = VerifyOptions(),
                runner: Runner | None = None, progress: Progress | None = None, sessions: dict | None = None) -> SlotReport:
    """Verify one slot's candidate variants (see :func:`kernelslot.verify.pipeline.verify_slot`).

    Collective slots run in rank processes of their own, isolated whatever ``runner`` is (it
    applies to single-device slots only); ``sessions`` (group size -> running session, closed by
    the caller) reuses rank processes across slots, for trusted kernels only (the built-ins). Variants this machine cannot run (``Candidate.needs``)
    are left out; when none can run, the report's status is ``not run`` with the reason.
    """
    cands = [candidates] if isinstance(candidates, Candidate) else list(candidates)
    unmet = [c.needs.unmet(pipeline.device_arch(opts.device)) for c in cands]
    if all(unmet):  # this machine cannot run any variant: not run, never a failure of the candidate
        return SlotReport(defn.name, ", ".join(c.name for c in cands), runner.name if runner else "-", opts.device,
                          not_run="; ".join(dict.fromkeys(u for u in unmet if u)))
    left_out = [f"{c.name}: not run: {u}" for c, u in zip(cands, unmet) if u]
    cands = [c for c, u in zip(cands, unmet) if not u]
    if defn.slot.kind is SlotKind.COLLECTIVE:
        from kernelslot.verify.collective import verify_collective  # spawns rank processes: imported when needed

        report = verify_collective(defn, cands, opts, progress, sessions=sessions)
    else:
        report = pipeline.verify_slot(defn, cands, opts, runner, progress)
    if left_out:  # the other variants' verdicts stand; these were never exercised
        report.notes.extend(left_out)
    return report
