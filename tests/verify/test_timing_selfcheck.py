"""The timing method read on an equal kernel: a bundle whose entry *is* the built-in, timed against
the built-in through identical runners, must read x1.0 within noise (docs/referee.md, Timing).

The default-suite test runs beside other tests on 2 cores, so its band is loose (it catches the
old method's x0.07-x15 misreadings, not a few percent); the slow test asks for x0.9-x1.1, which
holds on a quiet machine (the figures of `kernelslot verify --time` are in the closing notes).
"""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from kernelslot.isolation import make_runner
from kernelslot.isolation.runner import CallObservation
from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.slots.base import KernelSource
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.single.timed import (MAX_BATCH, MAX_IN_PROCESS_BATCH, MIN_REPETITION_S, ROUNDTRIP_SHARE, batch_cap,
                                            batch_size)

SELF = {"norm.rmsnorm": "from kernelslot.kernels.norm import rmsnorm as entry\n",
        "activation.silu_and_mul": "from kernelslot.kernels.activation import silu_and_mul as entry\n"}


def _self_timed(tmp_path, slot: str, profiles: tuple[str, ...], reps: int) -> list[dict]:
    path = tmp_path / f"{slot.replace('.', '_')}.py"
    path.write_text(SELF[slot])
    cand = Candidate(Kernel(None, None, name="self", source=KernelSource(entry="entry", file=str(path))))
    runner = make_runner(True, 30.0)
    try:
        report = verify_slot(get_slot(slot), cand, VerifyOptions(time=True, time_reps=reps, draws=0, profiles=profiles,
                                                                 dtypes=(torch.float32,)), runner=runner)
    finally:
        runner.close()
    assert report.passed, report.failed_checks()
    return [r.timing for r in report.results]


def test_batch_size_follows_the_incumbents_round_trip():
    calls = [CallObservation(elapsed_s=110e-6, worker_s=10e-6)] * 3  # 100 us of round trip per 10 us call
    assert ROUNDTRIP_SHARE == 0.02
    assert batch_size(calls) == 500  # 100 us <= 2% of 500 x 10 us
    jitter = [CallObservation(elapsed_s=e, worker_s=10e-6) for e in (110e-6, 3e-3, 105e-6, 115e-6, 90e-6)]
    assert batch_size(jitter) == 500  # the median single call: one interrupted request does not size the batch
    # batches of 100 calls whose request costs 200 us (2 us a call), more than a single call's 100 us:
    # the request's cost of a batch is read on batches
    batched = [CallObservation(elapsed_s=12e-6, worker_s=10e-6)] * 3
    assert batch_size(calls, batched, 100) == 1000  # 200 us <= 2% of 1000 x 10 us
    warm = [CallObservation(elapsed_s=5.5e-6, worker_s=5e-6)] * 3  # and the work per call: warm, 5 us
    assert batch_size(calls, warm, 100) == 500  # 50 us <= 2% of 500 x 5 us
    # in-process: no round trip; enough calls that a repetition lasts MIN_REPETITION_S, at most MAX_IN_PROCESS_BATCH
    assert batch_size([CallObservation(elapsed_s=1e-4)] * 3) == math.ceil(MIN_REPETITION_S / 1e-4)
    assert batch_size([CallObservation(elapsed_s=1e-8)]) == MAX_IN_PROCESS_BATCH
    assert batch_size([CallObservation(elapsed_s=1.0)]) == 1
    assert batch_size([CallObservation(elapsed_s=1.0, worker_s=1e-9)]) == MAX_BATCH
    slow = CallObservation(elapsed_s=0.06, worker_s=0.05)  # a slow candidate caps its own batches
    assert batch_cap(slow, calls[0], 1 << 10) == 5
    assert batch_cap(calls[0], calls[0], 32 << 20) == 4  # 128 MiB of sets at most


def test_an_equal_kernel_reads_as_equal_through_the_worker(tmp_path):
    """Up to three attempts: a loaded machine can spoil one reading, a biased method spoils all three."""
    readings = []
    for _ in range(3):
        timings = _self_timed(tmp_path, "norm.rmsnorm", ("decode_batch",), 5)
        assert all(t["batch"] > 1 and t["incumbent_roundtrip_s"] < t["incumbent_s"] for t in timings), timings
        readings.append([round(t["speedup"], 3) for t in timings])
        if all(0.5 <= r <= 2.0 for r in readings[-1]):
            return
    pytest.fail(f"an equal kernel read outside x0.5-x2.0 in three attempts: {readings}")


@pytest.mark.slow
@pytest.mark.parametrize("slot", sorted(SELF))
def test_an_equal_kernel_reads_within_ten_percent(tmp_path, slot):
    """On a quiet machine; the median over the profiles, each within a 0.8-1.25 band."""
    timings = _self_timed(tmp_path, slot, tuple(dict.fromkeys(p.name for p in get_slot(slot).profiles)), 9)
    ratios = [t["speedup"] for t in timings]
    assert all(0.8 <= r <= 1.25 for r in ratios), ratios
    assert 0.9 <= statistics.median(ratios) <= 1.1, ratios
