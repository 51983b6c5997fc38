"""Timing methodology: candidate and incumbent interleaved (AB BA AB ...) on the same fresh inputs.

The call plan (``verify/plan.py``) draws the warm-up and repetition counts per profile. Pair ``i``
of the sequence is the candidate's repetition and the incumbent's on one set of fresh inputs, back to
back in alternating order (the candidate first in even pairs; how a repetition is made, staged
and judged outside the timed window: ``timed.py``), through the same kind of runner
(``runner.incumbent_runner()``: in-process, or a worker of its own), so the runner's overhead
cancels in the ratio. The first ``warmup`` pairs are discarded. The speedup is the median of the
pairs' own ratios (:func:`time_interleaved`).

**Repetitions come from the incumbent's time, never the candidate's**: the plan fixes the least
number of timed pairs; where the incumbent's warm-up repetitions are so fast that they would fill
less than :data:`TARGET_TIMED_S`, more are added, up to ``MORE_REPS`` times as many (the plan draws
their poisons and positions in advance). Nothing the candidate does changes how often it is called.

**The physics floor** (``verify/single/roofline.py``): every timed candidate call is held to the least time
its traffic allows on this machine. A call measured below its floor is impossible: ``impossible``
is set, ``speedup`` is left out, and the caller fails ``time_impossible``. Before that verdict the
floor is recomputed with fresh probes (only the best machine figures count), so load on the machine
while the probes first ran cannot make an honest kernel impossible.

Reported (seconds) per side: ``*_s`` (median), ``*_min_s`` / ``*_max_s``, ``*_q1_s`` / ``*_q3_s``
(the interquartile range), ``*_spread`` ((max - min) / median), ``*_worker_s`` (median in-worker time per call, where the runner measures
one: the entry alone for a single call, the calls' loop over a batch) and ``*_roundtrip_s`` (median of referee time minus in-worker time: the
runner's own cost); then ``speedup`` (the median of the pairs' incumbent / candidate ratios, with
``speedup_q1`` / ``speedup_q3``) and ``noise`` (1.0 when those quartiles bracket 1: the ratio is not
distinguishable from equal); then the floor
of the call closest to it (``floor_s``, ``floor_bytes``, ``floor_flops``, the ceilings used
``floor_gbs`` / ``floor_tflops``, and ``floor_margin``: the smallest measured time / floor ratio).
"""
from __future__ import annotations

import math
import statistics
from typing import Callable

from kernelslot.verify.single.roofline import Floor
from kernelslot.verify.plan import MORE_REPS, TimingPlan
from kernelslot.isolation.runner import CallObservation, RunnerError


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


TARGET_TIMED_S = 0.25  # the incumbent's timed repetitions should add up to at least this (seconds)


def timed_reps(plan: TimingPlan, incumbent_warmup: list[CallObservation], calls_per_rep: int = 1) -> int:
    """How many timed pairs to make: the plan's, plus more (up to :data:`MORE_REPS` times as many, and
    what the plan drew) when the incumbent's repetitions so far (``calls_per_rep`` calls each, per-call
    times: the warm-ups, or the first timed one where no warm-up had the final batch size) show that
    its timed ones would fill less than :data:`TARGET_TIMED_S`."""
    capacity = len(plan.poisons) - plan.warmup
    if not incumbent_warmup:
        return plan.reps
    per_rep = statistics.median(o.elapsed_s for o in incumbent_warmup) * calls_per_rep
    wanted = math.ceil(TARGET_TIMED_S / per_rep) if per_rep > 0 else capacity
    return max(plan.reps, min(capacity, MORE_REPS * plan.reps, wanted))


def candidate_first(i: int) -> bool:
    """Which side of pair ``i`` runs first: the candidate in even pairs, the incumbent in odd ones
    (pair 0, the first warm-up, always starts with the candidate)."""
    return i % 2 == 0


def time_interleaved(plan: TimingPlan, candidate: Callable[[int], CallObservation | None],
                     incumbent: Callable[[int], CallObservation] | None,
                     floor: Callable[[int, bool], Floor] | None = None,
                     begin: Callable[[int], None] | None = None,
                     end: Callable[[int], bool] | None = None,
                     calls_per_rep: Callable[[], int] = lambda: 1) -> dict[str, float]:
    """Run the plan's pairs; ``begin(i)`` draws pair ``i``'s inputs (and may stage both sides' calls),
    ``candidate(i)`` makes call ``i`` (None: it failed a check, which the caller recorded: timing
    stops), ``incumbent(i)`` times the incumbent on the same inputs, and ``end(i)``, where given,
    completes both observations once both ran (False: a check failed: timing stops). The two
    alternate which goes first (:func:`candidate_first`), so whatever the first call of a pair leaves
    the second (warm inputs, a cooler or hotter core) falls on each side equally often.
    ``floor(i, fresh)`` is candidate call ``i``'s physics floor (``fresh``: probe the machine again);
    ``calls_per_rep()`` how many calls a repetition makes (a batch; the observations are per call).

    ``speedup`` is the median over the timed pairs of incumbent time / candidate time within a pair
    (``speedup_q1`` / ``speedup_q3`` its quartiles): the two calls of a pair run back to back, so a
    slow phase of the machine, which lasts longer than a pair, moves both and cancels in their
    ratio, where a ratio of the two sides' medians would carry it. ``noise`` is 1.0 when the
    ratios' interquartile range contains 1 (not distinguishable from equal)."""
    cand: list[tuple[int, CallObservation]] = []
    inc: list[CallObservation] = []
    made: list[tuple[CallObservation, int]] = []  # the incumbent's repetitions, with their calls each
    i, reps, decided = 0, plan.reps, False
    while i < plan.warmup + reps:
        calls = calls_per_rep()  # before the pair: ``end`` may change it (a batch sized after pair 0)
        if begin is not None:
            begin(i)
        other = None
        if incumbent is not None and not candidate_first(i):
            other = incumbent(i)
        obs = candidate(i)
        if obs is None:
            return {}
        if incumbent is not None and candidate_first(i):
            other = incumbent(i)
        if end is not None and not end(i):
            return {}
        if other is not None and other.error:
            raise RunnerError(f"the incumbent failed while being timed: {other.error.strip().splitlines()[-1]}")
        if i >= plan.warmup:
            cand.append((i, obs))
            if other is not None:
                inc.append(other)
        if other is not None:
            made.append((other, calls))
        i += 1
        if not decided and i >= plan.warmup:  # from repetitions of the size the rest will have (a single
            # first call, dominated by its round trip, would stand for a whole batch's time)
            full = [o for o, k in made if k == calls_per_rep()]
            if full or incumbent is None:
                reps, decided = timed_reps(plan, full, calls_per_rep()), True
    timing = summarize("candidate", [o for _, o in cand])
    if inc:
        timing.update(summarize("incumbent", inc))
        ratios = sorted(b.elapsed_s / a.elapsed_s if a.elapsed_s > 0 else 0.0 for (_, a), b in zip(cand, inc))
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else (ratios[0],) * 3
        timing.update(speedup=statistics.median(ratios), speedup_q1=q1, speedup_q3=q3, noise=1.0 if q1 <= 1.0 <= q3 else 0.0)
    if floor is not None:
        timing.update(judge_floor(cand, floor))
        if timing.get("impossible"):
            for key in ("speedup", "speedup_q1", "speedup_q3"):
                timing.pop(key, None)
    return timing


def judge_floor(calls: list[tuple[int, CallObservation]], floor: Callable[[int, bool], Floor]) -> dict[str, float]:
    """The floor figures of the timed call nearest its floor; ``impossible`` when one is below it
    even after the machine was probed again."""
    def ratio(elapsed: float, f: Floor) -> float:
        return elapsed / f.seconds if f.seconds > 0 else math.inf if elapsed > 0 else 0.0

    refreshed: set[int] = set()
    while True:
        margin, i, f = min(((ratio(o.elapsed_s, f), i, f) for i, o in calls for f in (floor(i, False),)),
                           key=lambda m: m[0])
        if margin >= 1.0 or i in refreshed:
            break
        floor(i, True)  # probe the machine again before calling anything impossible
        refreshed.add(i)
    finite = lambda v: v if math.isfinite(v) else 0.0  # noqa: E731 - JSON has no infinity (0: not bounded)
    out = {"floor_s": f.seconds, "floor_bytes": float(f.bytes), "floor_flops": float(f.flops),
           "floor_gbs": finite(f.bandwidth / 1e9), "floor_tflops": finite(f.flops_rate / 1e12), "floor_margin": finite(margin)}
    if margin < 1.0:
        out["impossible"] = 1.0
    return out


def impossible_message(timing: dict[str, float]) -> str:
    """Why ``timing`` (with ``impossible`` set) cannot be right, with its numbers."""
    t = timing
    flops = f", {t['floor_flops']:.0f} flop at most {t['floor_tflops']:.4g} Tflop/s" if t["floor_flops"] else ""
    return (f"a timed call took {t['floor_margin'] * t['floor_s'] * 1e6:.3g} us, below its physics floor of "
            f"{t['floor_s'] * 1e6:.3g} us ({t['floor_bytes']:.0f} B at most {t['floor_gbs']:.4g} GB/s{flops}): "
            "its clock was misled or its work ran outside the timed window")
