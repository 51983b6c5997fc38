"""Timing methodology: candidate and incumbent interleaved (ABAB) on the same fresh inputs.

The call plan (``verify/plan.py``) draws the warm-up and repetition counts per profile. Call ``i``
of the sequence is a pair: the candidate's call (the pipeline refills the inputs, poisons the
outputs and checks the result, all outside the timed window), then the incumbent's call on the
same inputs. Both go through the same kind of runner (``runner.incumbent_runner()``: in-process,
or a worker of its own), so the runner's overhead cancels in the ratio. The first ``warmup`` pairs
are discarded.

Reported (seconds) per side: ``*_s`` (median), ``*_min_s`` / ``*_max_s``, ``*_q1_s`` / ``*_q3_s``
(the interquartile range), ``*_spread`` ((max - min) / median), ``*_worker_s`` (median in-worker time of the entry alone, where the
runner measures one) and ``*_roundtrip_s`` (median of referee time minus in-worker time: the
runner's own cost); then ``speedup`` (incumbent median / candidate median) and ``noise`` (1.0 when
the two interquartile ranges overlap: the ratio is not distinguishable from noise).
"""
from __future__ import annotations

import statistics
from typing import Callable

from kernelslot.verify.plan import TimingPlan
from kernelslot.verify.runner import CallObservation, RunnerError


def summarize(prefix: str, observations: list[CallObservation]) -> dict[str, float]:
    """Median, range, quartiles and (where measured) in-worker time and round trip of ``observations``."""
    times = sorted(o.elapsed_s for o in observations)
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else (times[0],) * 3
    med = statistics.median(times)
    out = {f"{prefix}_s": med, f"{prefix}_min_s": times[0], f"{prefix}_max_s": times[-1],
           f"{prefix}_q1_s": q1, f"{prefix}_q3_s": q3, f"{prefix}_spread": (times[-1] - times[0]) / med if med > 0 else 0.0}
    if all(o.worker_s is not None for o in observations):
        out[f"{prefix}_worker_s"] = statistics.median(o.worker_s for o in observations)  # type: ignore[misc]
        out[f"{prefix}_roundtrip_s"] = statistics.median(o.elapsed_s - o.worker_s for o in observations)  # type: ignore[operator]
    return out


def time_interleaved(plan: TimingPlan, candidate: Callable[[int], CallObservation | None],
                     incumbent: Callable[[int], CallObservation] | None) -> dict[str, float]:
    """Run the plan's pairs; ``candidate(i)`` makes and checks call ``i`` (None: it failed a check,
    which the caller recorded: timing stops), ``incumbent(i)`` times the incumbent on the same inputs."""
    cand: list[CallObservation] = []
    inc: list[CallObservation] = []
    for i in range(plan.warmup + plan.reps):
        obs = candidate(i)
        if obs is None:
            return {}
        other = incumbent(i) if incumbent is not None else None
        if other is not None and other.error:
            raise RunnerError(f"the incumbent failed while being timed: {other.error.strip().splitlines()[-1]}")
        if i >= plan.warmup:
            cand.append(obs)
            if other is not None:
                inc.append(other)
    timing = summarize("candidate", cand)
    if inc:
        timing.update(summarize("incumbent", inc))
        timing["speedup"] = timing["incumbent_s"] / timing["candidate_s"] if timing["candidate_s"] else 0.0
        overlap = timing["candidate_q1_s"] <= timing["incumbent_q3_s"] and timing["incumbent_q1_s"] <= timing["candidate_q3_s"]
        timing["noise"] = 1.0 if overlap else 0.0
    return timing
