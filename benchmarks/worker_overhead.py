"""Per-call overhead of the worker runner against the in-process runner.

Times the built-in ``activation.silu_and_mul`` kernel through both runners on the same shared
tensors (median of 50 calls after 5 warm-ups, no settle delay, checked and unchecked calls),
and prints the round trip, the time measured inside the worker, and the difference.

    .venv/bin/python benchmarks/worker_overhead.py
"""
from __future__ import annotations

import statistics

import torch

from kernelslot.abi import OutputSpec, allocate_output
from kernelslot.slots import get_slot
from kernelslot.verify import InProcessRunner, Runner
from kernelslot.verify.worker import WorkerRunner

CALLS, WARMUP = 50, 5


def measure(runner: Runner, shape: tuple[int, int], check: bool) -> tuple[float, float | None]:
    kernel = get_slot("activation.silu_and_mul").incumbent
    x = runner.share(torch.randn(shape[0], 2 * shape[1]))
    out = allocate_output(OutputSpec(shape, torch.float32), "cpu")
    runner.share([out.base])
    args = [x, out.view]
    for _ in range(WARMUP):
        runner.call(kernel, args, check_retention=check)
    round_trip, inner = [], []
    for _ in range(CALLS):
        obs = runner.call(kernel, args, check_retention=check)
        if obs.error:
            raise RuntimeError(obs.error)
        round_trip.append(obs.elapsed_s)
        inner.append(obs.worker_s)
    return statistics.median(round_trip), statistics.median(inner) if inner[0] is not None else None


def main() -> None:
    in_process = InProcessRunner()
    with WorkerRunner(settle_s=0.0) as worker:
        for shape in ((1, 64), (16, 1024)):
            for check in (False, True):
                a, _ = measure(in_process, shape, check)
                b, inner = measure(worker, shape, check)
                print(f"out {shape} checked={check}: in-process {a * 1e6:7.1f} us | worker round trip {b * 1e6:7.1f} us "
                      f"(in-worker {inner * 1e6:6.1f} us) | overhead {(b - a) * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
