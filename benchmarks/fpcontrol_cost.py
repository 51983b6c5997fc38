"""Cost of one outside reading of a worker's floating-point control state (kernelslot/isolation/fpcontrol.py).

Starts a sandboxed worker (``WorkerRunner``, the sandbox ``auto`` picks) and loads a small honest
rmsnorm that keeps an idle pool of ``THREADS - 1`` threads (as a kernel library would), so the worker has
about ``THREADS`` threads; then times ``observe(worker)`` ``READS`` times in each of ``ROUNDS`` rounds,
a call between rounds, and prints the thread count, the median and 90th percentile per reading and the
median call round trip (without the settle window) for scale. Two readings per call (before and after)
cost twice the median; one per request (after it, compared with the previous reading) once.

    .venv/bin/python benchmarks/fpcontrol_cost.py [THREADS]
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import torch

from kernelslot.isolation.fpcontrol import observe
from kernelslot.slots import Kernel
from kernelslot.slots.base import KernelSource
from kernelslot.isolation.worker import WorkerRunner

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
READS, ROUNDS = 100, 5
KERNEL = f'''
import threading
from concurrent.futures import ThreadPoolExecutor
import torch
_pool = None
def entry(x, weight, out, eps):
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers={THREADS - 1})
        started = threading.Barrier({THREADS - 1})
        for f in [_pool.submit(started.wait) for _ in range({THREADS - 1})]:
            f.result()
    xf = x.float()
    out.copy_(xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float())
'''


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pooled_rmsnorm.py")
        with open(path, "w") as f:
            f.write(KERNEL)
        kernel = Kernel(None, None, name="pooled", source=KernelSource(entry="entry", file=path))
        x, w, out = torch.randn(64, 1024), torch.rand(1024) + 0.5, torch.empty(64, 1024)
        with WorkerRunner(settle_s=0.0) as runner:
            runner.share([x, w, out])
            if (obs := runner.call(kernel, [x, w, out, 1e-6])).error:
                raise SystemExit(obs.error)
            pid = runner._proc.pid
            first = observe(pid)
            if first.error:
                raise SystemExit(f"not observed: {first.error}")
            reads, calls = [], []
            for _ in range(ROUNDS):
                for _ in range(READS):
                    start = time.perf_counter()
                    r = observe(pid)
                    reads.append(time.perf_counter() - start)
                    assert r.observed, r.describe()
                start = time.perf_counter()
                runner.call(kernel, [x, w, out, 1e-6])
                calls.append(time.perf_counter() - start)
            reads.sort()
            print(f"{runner.name}: {len(first.threads)} threads; observe(): median {statistics.median(reads) * 1e3:.3f} ms, "
                  f"p90 {reads[int(0.9 * len(reads))] * 1e3:.3f} ms over {len(reads)} readings; "
                  f"call round trip (no settle) median {statistics.median(calls) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
