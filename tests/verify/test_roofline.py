"""The physics floor (verify/single/roofline.py): generous ceilings, impossible times fail, honest ones never do."""
from __future__ import annotations

import time

import pytest
import torch

from kernelslot.verify.single import roofline
from kernelslot.verify.single.timing import judge_floor, time_interleaved
from kernelslot.slots import get_slot
from kernelslot.slots.base import Traffic
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.plan import TimingPlan
from kernelslot.isolation.runner import CallObservation


def test_stated_ceiling_replaces_the_probes(monkeypatch):
    monkeypatch.setenv("KERNELSLOT_PEAK_GBS", "10")
    monkeypatch.setenv("KERNELSLOT_PEAK_TFLOPS", "1")
    f = roofline.floor(Traffic(10**6, 4 * 10**6), "cpu")
    assert f.seconds == pytest.approx(max(1e6 / 10e9, 4e6 / 1e12))
    monkeypatch.setenv("KERNELSLOT_PEAK_GBS", "fast")
    with pytest.raises(ValueError, match="KERNELSLOT_PEAK_GBS"):
        roofline.floor(Traffic(1), "cpu")


@pytest.mark.parametrize("size", [64 << 10, 1 << 20, 8 << 20])
def test_ceiling_exceeds_what_an_honest_copy_reaches(size):
    """Hot-buffer copies (read + write, the way a kernel's traffic is counted) stay under the ceiling."""
    src, dst = torch.rand(size // 8), torch.empty(size // 8)  # src + dst = size bytes moved
    best = 0.0
    for _ in range(30):
        start = time.perf_counter()
        dst.copy_(src)
        best = max(best, size / (time.perf_counter() - start))
    assert roofline.bandwidth_ceiling(torch.device("cpu"), size) > best


def test_a_time_below_the_floor_is_impossible_after_probing_again():
    probes = []

    def floor(i, fresh):
        probes.append(fresh)
        return roofline.Floor(1e-3, 1000, 0, 1e6, 0.0)

    calls = [(0, CallObservation(elapsed_s=2e-3)), (1, CallObservation(elapsed_s=5e-4))]
    out = judge_floor(calls, floor)
    assert out["impossible"] == 1.0 and out["floor_margin"] == pytest.approx(0.5) and True in probes
    assert "impossible" not in judge_floor(calls[:1], floor)
    assert judge_floor([(0, CallObservation(elapsed_s=0.0))], lambda i, f: roofline.Floor(0.0, 0, 0, 0.0, 0.0))["impossible"]


def test_impossible_timing_reports_no_speedup_and_reps_follow_the_incumbent():
    plan = TimingPlan(1, 4, ("nan",) * 9, (0,) * 9)
    seen = []

    def cand(i):
        seen.append(i)
        return CallObservation(elapsed_s=1e-9)

    t = time_interleaved(plan, cand, lambda i: CallObservation(elapsed_s=1e-6), lambda i, f: roofline.Floor(1e-6, 1, 0, 1.0, 0.0))
    assert t["impossible"] == 1.0 and "speedup" not in t
    assert len(seen) == 1 + 8  # a fast incumbent: twice the plan's repetitions (its capacity)
    seen.clear()
    time_interleaved(plan, cand, lambda i: CallObservation(elapsed_s=1.0))
    assert len(seen) == 1 + 4  # a slow incumbent: the plan's count, whatever the candidate's time


@pytest.mark.parametrize("slot", ["norm.rmsnorm", "activation.silu_and_mul"])
def test_honest_builtins_are_never_impossible(slot):
    defn = get_slot(slot)
    report = verify_slot(defn, defn.builtin_candidates(), VerifyOptions(dtypes=(torch.float32,), time=True, time_reps=3))
    assert report.passed, report.failed_checks()
    assert all(r.timing["floor_s"] > 0 and r.timing["floor_margin"] > 1 for r in report.results)
