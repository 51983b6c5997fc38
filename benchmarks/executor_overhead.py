"""Per-call overhead of the serving executor (isolation/executor.py) for a no-op entry.

Calls a no-op ``entry(x, out)`` (x and out (1, 64) fp32) ``--calls`` times through
``Executor.call`` (staging copies, poison, doorbell, reply, copy back) and, for comparison, the
same function in-process, and prints median and p99 of each in microseconds with the machine's
load average. ``--rounds`` interleaves the two ``--rounds`` times and reports the medians.

    .venv/bin/python benchmarks/executor_overhead.py [--calls 2000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from kernelslot.isolation.executor import Executor
from kernelslot.slots.base import Kernel, KernelSource

NOOP = Path(__file__).resolve().parents[1] / "tests" / "isolation" / "served" / "kernels.py"


def _times(fn, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def _stats(t: list[float]) -> tuple[float, float]:
    t = sorted(t)
    return statistics.median(t), t[min(len(t) - 1, int(0.99 * len(t)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    kernel = Kernel(None, None, name="noop", source=KernelSource(entry="noop", file=str(NOOP)))
    x, out = torch.randn(1, 64), torch.empty(1, 64)
    sys.path.insert(0, str(NOOP.parent))
    import kernels as local  # the same no-op, in this process

    rows = {"executor": [], "in-process": []}
    with Executor(call_timeout_s=10.0) as ex:
        ex.call(kernel, (x, out), (1,))
        for _ in range(args.rounds):
            _times(lambda: ex.call(kernel, (x, out), (1,)), 100)  # warm
            rows["executor"].append(_stats(_times(lambda: ex.call(kernel, (x, out), (1,)), args.calls)))
            rows["in-process"].append(_stats(_times(lambda: local.noop(x, out), args.calls)))
        mode = ex.sandbox_mode
    load = os.getloadavg()
    print(f"no-op entry, {args.calls} calls x {args.rounds} rounds, sandbox {mode}, load {load[0]:.2f} {load[1]:.2f}")
    for name, r in rows.items():
        med = statistics.median(m for m, _ in r)
        p99 = statistics.median(p for _, p in r)
        print(f"  {name:10s} median {med:7.1f} us  p99 {p99:7.1f} us  (rounds: "
              + ", ".join(f"{m:.1f}/{p:.1f}" for m, p in r) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
