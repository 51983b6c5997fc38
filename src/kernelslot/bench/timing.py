"""Timing methodology: medians of repeated calls, candidate and incumbent side by side.

Each timed call goes through the runner (so isolation overhead is counted the same way for
both). Warm-up calls are discarded; the median and the spread (max-min over median) of the
timed calls are reported; speedup = incumbent median / candidate median, measured in the
same run on the same inputs.
"""
from __future__ import annotations

import statistics
from typing import Any

from kernelslot.slots.base import Candidate, Case, SlotDef
from kernelslot.verify.runner import InProcessRunner, Runner

WARMUP = 2


def median_call_time(runner: Runner, cand_kernel: Any, args: list, reps: int) -> tuple[float, float]:
    for _ in range(WARMUP):
        runner.call(cand_kernel, args, check_retention=False)
    times = [runner.call(cand_kernel, args, check_retention=False).elapsed_s for _ in range(reps)]
    med = statistics.median(times)
    return med, (max(times) - min(times)) / med if med > 0 else 0.0


def time_side_by_side(defn: SlotDef, cand: Candidate, runner: Runner, case: Case, prepared: Any, args: list, reps: int) -> dict[str, float]:
    cand_med, cand_spread = median_call_time(runner, cand.kernel, args, reps)
    timing = {"candidate_s": cand_med, "candidate_spread": cand_spread}
    incumbent = defn.incumbent
    if incumbent.entry is not cand.kernel.entry:
        trusted = InProcessRunner()
        inc_args = list(args)
        if defn.slot.needs_prepare:
            from kernelslot.abi import Role

            inc_prepared = trusted.prepare(incumbent, case.prepare_args)
            inc_args = [inc_prepared if a.role is Role.PREPARED else v for a, v in zip(defn.slot.args, args)]
        inc_med, inc_spread = median_call_time(trusted, incumbent, inc_args, reps)
        timing.update(incumbent_s=inc_med, incumbent_spread=inc_spread, speedup=inc_med / cand_med if cand_med else 0.0)
    return timing
