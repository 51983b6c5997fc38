"""The read-bandwidth probe (kernels/native/probe.py, ks_probe.c): every method reads every byte
exactly once (checksum), returns a finite positive rate, and the best-method selection is a
deterministic function of the measured rates. No timing is asserted."""
from __future__ import annotations

import math
import statistics

import pytest

from kernelslot.kernels.native import native_status
from kernelslot.kernels.native.probe import (PREFETCH, STREAMS, WIDTHS, ProbeBuffer, ReadLimit, ReadMethod,
                                             read_methods, select_best, width_supported)

AVAILABLE, _, REASON = native_status()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"native path unavailable: {REASON}")
MIB2 = 2 << 20


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next(line for line in f if line.startswith("flags")).split(":")[1].split())
    except (OSError, StopIteration):
        return set()


@pytest.fixture(scope="module", params=[False, True], ids=["4k", "thp"])
def buf(request):
    b = ProbeBuffer(2 * MIB2, request.param)
    yield b
    b.close()


def test_every_method_reads_every_byte_once(buf):
    for m in read_methods(huge=(buf.huge,)):
        for threads in (1, 2, 3):
            # whole buffer, and a range whose size divides by neither the threads nor the streams
            for off, n in ((0, None), (64 * 3, 256 * 4097)):
                rate, csum = buf.read(m, threads, off, n)
                assert csum == buf.expected_sum(off, n), (m.name, threads, off, n)
                assert math.isfinite(rate) and rate > 0, (m.name, rate)


def test_checksum_detects_a_changed_word(buf):
    m = read_methods(huge=(buf.huge,))[0]
    rate, csum = buf.read(m, 2, 0, 1 << 20)
    assert csum != buf.expected_sum(0, (1 << 20) - 256) and csum != buf.expected_sum(64, 1 << 20)


def test_methods_are_a_fixed_grid_of_supported_widths():
    ms = read_methods()
    assert ms == read_methods() and len(set(ms)) == len(ms)
    widths = {m.width for m in ms}
    assert widths == {w for w in WIDTHS if width_supported(w)} and 64 in widths
    assert len(ms) == len(widths) * len(STREAMS) * len(PREFETCH) * 2
    if "avx512f" in _cpu_flags():
        assert ms[0].width == 512
    else:
        assert 512 not in widths


def test_select_best_takes_the_largest_median_and_the_first_on_ties():
    a, b, c = (ReadMethod(64, s, 0, False) for s in (1, 2, 4))
    calls = []
    rates = {a: iter([5, 50, 5]), b: iter([9, 9, 1]), c: iter([9, 1, 9])}

    def measure(m):
        calls.append(m)
        return next(rates[m])
    best, med = select_best(measure, (a, b, c), rounds=3)
    assert calls == [a, b, c] * 3  # round-robin
    assert med == {a: 5, b: 9, c: 9} and best == b  # b and c tie at 9: the earlier one
    assert select_best(lambda m: 1.0, (c, b, a), rounds=1)[0] == c
    with pytest.raises(ValueError):
        select_best(measure, (), rounds=3)


def test_read_limit_keeps_the_best_methods_and_their_buffers():
    ms = read_methods(widths=(64,), streams=(1, 2), prefetch=(0, 512))
    lim = ReadLimit.measure(2, nbytes=4 * MIB2, slice_bytes=MIB2, rounds=1, methods=ms, keep=2)
    assert set(lim.medians) == set(ms) and len(lim.top) == 2 and lim.best == lim.top[0]
    assert lim.best == max(ms, key=lambda m: (lim.medians[m], -ms.index(m)))
    assert lim.medians[lim.top[0]] >= lim.medians[lim.top[1]]
    assert set(lim.buffers) == {m.huge for m in lim.top}
    with pytest.raises(ValueError, match="no read"):
        lim.limit()
    reads = [lim.read() for _ in range(6)]
    assert all(math.isfinite(r) and r > 0 for r in reads)
    assert lim.limit() == max(statistics.median(reads[0::2]), statistics.median(reads[1::2]))
    assert lim.table(top=1)[0][0] == lim.best.name


def test_bad_arguments_are_refused(buf):
    m = read_methods(huge=(buf.huge,))[0]
    with pytest.raises(ValueError, match="multiple of 64"):
        buf.read(m, 1, 32, 256)
    with pytest.raises(ValueError, match="huge"):
        buf.read(ReadMethod(m.width, 1, 0, not buf.huge), 1)
    with pytest.raises(ValueError, match="not supported"):
        buf.read(ReadMethod(100, 1, 0, buf.huge), 1)
    with pytest.raises(ValueError):
        ProbeBuffer(12345, False)
