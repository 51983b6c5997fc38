"""Per-call overhead of the worker runner, unsandboxed and in each sandbox, against in-process.

Times the built-in ``activation.silu_and_mul`` kernel through every runner on the same shared
tensors (median of 50 calls after 5 warm-ups, no settle delay, checked and unchecked calls;
the runners are measured in turn, ``ROUNDS`` times interleaved, and the medians of the rounds
reported), and prints the referee's round trip and the overhead over in-process. The worker
figure includes everything the referee does per call (the process-tree check included).

    .venv/bin/python benchmarks/worker_overhead.py
"""
from __future__ import annotations

import statistics

import torch

from kernelslot.abi import OutputSpec, allocate_output
from kernelslot.slots import get_slot
from kernelslot.isolation.runner import InProcessRunner, Runner
from kernelslot.isolation.sandbox import SandboxUnavailable, select
from kernelslot.isolation.worker import WorkerRunner

CALLS, WARMUP, ROUNDS = 50, 5, 3


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
    runners: dict[str, Runner] = {"in-process": InProcessRunner()}
    for mode in ("none", "unshare", "bwrap"):
        try:
            select(mode)
        except SandboxUnavailable:
            continue
        runners[f"worker/{mode}"] = WorkerRunner(settle_s=0.0, sandbox=mode)
    try:
        for shape in ((1, 64), (16, 1024)):
            for check in (False, True):
                rounds: dict[str, list[float]] = {name: [] for name in runners}
                for _ in range(ROUNDS):
                    for name, runner in runners.items():
                        rounds[name].append(measure(runner, shape, check)[0])
                base = statistics.median(rounds["in-process"])
                cells = [f"{name} {statistics.median(v) * 1e6:7.1f} us (+{(statistics.median(v) - base) * 1e6:6.1f})"
                         for name, v in rounds.items()]
                print(f"out {shape} checked={check}: " + " | ".join(cells))
    finally:
        for runner in runners.values():
            runner.close()


if __name__ == "__main__":
    main()
