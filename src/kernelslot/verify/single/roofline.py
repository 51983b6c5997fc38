"""The physics floor for timing: no call is faster than the bytes it must move allow.

A slot declares the least work of one call (``SlotDef.traffic(case) -> Traffic``: bytes it must
read plus write, and flops). This module measures what the machine can do at most and turns
the two into the call's **floor**::

    floor_s = max(bytes / bandwidth_ceiling, flops / flops_ceiling)

A measured candidate time below its floor is impossible (the timing fails ``time_impossible``;
never reported as a speedup): the clock that measured it was lied to, or the work happened
outside the measured window.

The ceilings are upper bounds, on purpose generous, because calling an honest fast kernel
impossible is as bad as missing a cheat:

- **Bandwidth** is probed at the call's working-set size (rounded *down* to a power of two, so
  a call whose data sits in cache is held to cache bandwidth, never to DRAM's; at most 4 MiB, so
  a larger call is held to that size's rate, a looser floor but a probe short enough to run
  unpreempted): the inputs of a
  timed call were just written by the referee and are hot. One probe sums a buffer of that size
  read over and over in one operation (a stride-0 view, so per-operation overhead is amortised),
  with every intra-op thread; the best of many short probes counts (on a loaded machine most are
  preempted, the best is not). The ceiling is the largest rate any probe of this process measured
  at that size or smaller, times ``BANDWIDTH_SAFETY`` (8: a hand-written kernel may use the
  memory system better than ``torch.sum`` does, and a loaded machine may have slowed every probe;
  reads and writes are both counted at the read rate).
- **Flops**: the largest rate of square matmul probes in float32 and bfloat16 (and float16 on
  CUDA), times ``FLOPS_SAFETY`` (8: fp8/fp4 units run 2-4x bf16).
- Before any call is judged impossible the probes run again, ``FRESH_ROUNDS`` times (the machine
  may have been loaded while they first ran), and only the best figures count.
- ``KERNELSLOT_PEAK_GBS`` / ``KERNELSLOT_PEAK_TFLOPS`` replace the probes with a stated ceiling
  (used as given: no safety factor).

Probes are cached per process, per device and size class; each takes a few milliseconds.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch

from kernelslot.slots.base import Traffic

BANDWIDTH_SAFETY = 8.0
FLOPS_SAFETY = 8.0
MIN_PROBE_BYTES = 16 << 10  # below this a call's floor is far under any runner's overhead
MAX_PROBE_BYTES = 4 << 20  # larger calls are held to this size's (cache) rate: short probes, a looser floor
PROBE_READ_BYTES = {"cpu": 2 << 20, "cuda": 256 << 20}  # bytes read per probe (the buffer re-read): short probes
PROBE_REPEATS = 15  # the best of many short probes: on a loaded machine most are preempted, the best is not
FRESH_ROUNDS = 3  # probe rounds before a call is judged impossible
_clock = time.perf_counter  # bound at import: the floor's own measurements use the referee's clock

_bandwidth: dict[tuple[str, int], float] = {}  # (device, size class) -> best bytes/s measured
_flops: dict[str, float] = {}  # device -> best flop/s measured


@dataclass(frozen=True)
class Floor:
    """One call's floor and the figures it came from."""

    seconds: float
    bytes: int
    flops: int
    bandwidth: float  # ceiling used, bytes/s
    flops_rate: float  # ceiling used, flop/s


def _env(name: str) -> float | None:
    value = os.environ.get(name)
    try:
        return float(value) if value else None
    except ValueError:
        raise ValueError(f"${name}={value!r} is not a number") from None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _size_class(nbytes: int) -> int:
    """A power of two <= nbytes, within the probe sizes (smaller is never slower: conservative)."""
    return min(MAX_PROBE_BYTES, max(MIN_PROBE_BYTES, 1 << max(0, int(nbytes).bit_length() - 1)))


def probe_bandwidth(device: torch.device, size: int, repeats: int = PROBE_REPEATS) -> float:
    """Best read rate (bytes/s) of ``repeats`` probes re-reading a hot ``size``-byte buffer, with
    every intra-op thread and (CPU) with one: on a loaded machine a thread pool's barrier can wait a
    whole time slice for a descheduled thread, one thread never does."""
    n = size // 4
    buf = torch.rand(n, device=device)
    reps = max(1, PROBE_READ_BYTES.get(device.type, 2 << 20) // size)
    view = buf.expand(reps, n)  # stride 0: the same bytes read ``reps`` times in one operation
    best = 0.0
    for threads in (None, 1) if device.type == "cpu" else (None,):
        previous = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            for _ in range(repeats + 1):  # the first warms the buffer and the kernel
                _sync(device)
                start = _clock()
                view.sum()
                _sync(device)
                elapsed = _clock() - start
                if elapsed > 0:
                    best = max(best, reps * n * 4 / elapsed)
        finally:
            torch.set_num_threads(previous)
    return best


def probe_flops(device: torch.device, repeats: int = 6) -> float:
    """Best matmul rate (flop/s) over float32, bfloat16 (and float16 on CUDA)."""
    size = 4096 if device.type == "cuda" else 384
    dtypes = (torch.float32, torch.bfloat16) + ((torch.float16,) if device.type == "cuda" else ())
    best = 0.0
    for dtype in dtypes:
        a = torch.rand(size, size, device=device).to(dtype)
        b = torch.rand(size, size, device=device).to(dtype)
        for _ in range(repeats + 1):
            _sync(device)
            start = _clock()
            a @ b
            _sync(device)
            elapsed = _clock() - start
            if elapsed > 0:
                best = max(best, 2 * size**3 / elapsed)
    return best


def bandwidth_ceiling(device: torch.device, nbytes: int, fresh: bool = False) -> float:
    """The most bytes/s a call moving ``nbytes`` can reach here (``fresh``: probe again first)."""
    stated = _env("KERNELSLOT_PEAK_GBS")
    if stated is not None:
        return stated * 1e9
    size = _size_class(nbytes)
    key = (str(device), size)
    for _ in range(FRESH_ROUNDS if fresh else 0 if key in _bandwidth else 1):
        _bandwidth[key] = max(_bandwidth.get(key, 0.0), probe_bandwidth(device, size))
    # a smaller working set is never slower: any rate measured at or below this size bounds it too
    best = max(v for (d, s), v in _bandwidth.items() if d == str(device) and s <= size)
    return best * BANDWIDTH_SAFETY


def flops_ceiling(device: torch.device, fresh: bool = False) -> float:
    """The most flop/s any call can reach here (``fresh``: probe again first)."""
    stated = _env("KERNELSLOT_PEAK_TFLOPS")
    if stated is not None:
        return stated * 1e12
    key = str(device)
    for _ in range(FRESH_ROUNDS if fresh else 0 if key in _flops else 1):
        _flops[key] = max(_flops.get(key, 0.0), probe_flops(device))
    return _flops[key] * FLOPS_SAFETY


def floor(traffic: Traffic, device: torch.device | str, fresh: bool = False) -> Floor:
    """The least time a call with ``traffic`` can take on ``device``."""
    device = torch.device(device)
    bw = bandwidth_ceiling(device, traffic.bytes, fresh) if traffic.bytes > 0 else math.inf
    fl = flops_ceiling(device, fresh) if traffic.flops > 0 else math.inf
    seconds = max(traffic.bytes / bw if traffic.bytes else 0.0, traffic.flops / fl if traffic.flops else 0.0)
    return Floor(seconds, traffic.bytes, traffic.flops, bw, fl)
