"""Timing methodology: medians of repeated calls, candidate and incumbent side by side.

Each timed call goes through a runner, so isolation overhead is counted the same way for both:
the incumbent runs under ``runner.incumbent_runner()`` (in-process for the in-process runner; a
separate worker of its own for ``WorkerRunner``, so a candidate cannot slow it down). Warm-up
calls are discarded; before every timed repetition ``refill`` (when given) writes fresh values
into the same input storages, outside the timed window, so cached results do not count. Reported
(seconds): the median and the spread ((max-min)/median) of the referee-side times, the median
in-worker time where the runner measures one (``*_worker_s``), and speedup = incumbent median /
candidate median, measured in the same run on the same inputs.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from kernelslot.slots.base import Candidate, Case, Kernel, SlotDef
from kernelslot.verify.runner import Runner, RunnerError

WARMUP = 2


@dataclass(frozen=True)
class CallTiming:
    median_s: float
    spread: float
    worker_median_s: float | None  # None when the runner reports no in-worker time


def median_call_time(runner: Runner, kernel: Kernel, args: list, reps: int,
                     refill: Callable[[int], Any] | None = None) -> CallTiming:
    """Time ``reps`` calls after ``WARMUP`` discarded ones; a failing call raises :class:`RunnerError`."""
    times: list[float] = []
    inner: list[float | None] = []
    for rep in range(-WARMUP, reps):
        if refill is not None and rep >= 0:
            refill(rep)
        obs = runner.call(kernel, args, check_retention=False)
        if obs.error:
            raise RunnerError(f"{kernel.name or 'kernel'} failed while being timed: {obs.error.strip().splitlines()[-1]}")
        if rep >= 0:
            times.append(obs.elapsed_s)
            inner.append(obs.worker_s)
    med = statistics.median(times)
    worker = statistics.median(inner) if inner and all(w is not None for w in inner) else None  # type: ignore[type-var]
    return CallTiming(med, (max(times) - min(times)) / med if med > 0 else 0.0, worker)


def time_side_by_side(defn: SlotDef, cand: Candidate, runner: Runner, case: Case, prepared: Any, args: list, reps: int,
                      refill: Callable[[int], Any] | None = None, incumbent: Kernel | None = None,
                      check_candidate: Callable[[], None] | None = None) -> dict[str, float]:
    """Time ``cand`` and the incumbent (by default the slot's; pass the routed built-in) on the same calls.

    ``check_candidate`` runs right after the candidate's timed calls (before the incumbent
    overwrites the outputs), so the referee can check that the timed calls did the work.
    """
    cand_t = median_call_time(runner, cand.kernel, args, reps, refill)
    if check_candidate is not None:
        check_candidate()
    timing = {"candidate_s": cand_t.median_s, "candidate_spread": cand_t.spread}
    if cand_t.worker_median_s is not None:
        timing["candidate_worker_s"] = cand_t.worker_median_s
    incumbent = incumbent or defn.incumbent
    if incumbent.entry is not cand.kernel.entry:
        trusted = runner.incumbent_runner()
        inc_args = list(args)
        if defn.slot.needs_prepare:
            from kernelslot.abi import Role

            inc_prepared = trusted.prepare(incumbent, case.prepare_args)
            inc_args = [inc_prepared if a.role is Role.PREPARED else v for a, v in zip(defn.slot.args, args)]
        inc_t = median_call_time(trusted, incumbent, inc_args, reps, refill)
        timing.update(incumbent_s=inc_t.median_s, incumbent_spread=inc_t.spread,
                      speedup=inc_t.median_s / cand_t.median_s if cand_t.median_s else 0.0)
        if inc_t.worker_median_s is not None:
            timing["incumbent_worker_s"] = inc_t.worker_median_s
    return timing
