"""Quantise / dequantise throughput of the kernelslot.formats codecs on CPU.

Prints, for a 4096x4096 fp32 matrix, the median time of several runs and the throughput in
GB/s of fp32 input (quantise) or of fp32 output (dequantise) — the same 64 MiB either way —
for MXFP4, MXFP8 (E4M3) and NVFP4.

    .venv/bin/python benchmarks/formats_throughput.py [--rows 4096] [--cols 4096] [--runs 7] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from kernelslot.formats import dequantize_mx, dequantize_nvfp4, quantize_mx, quantize_nvfp4


def median_seconds(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up (allocator, first-touch)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    x = torch.randn(args.rows, args.cols, generator=torch.Generator().manual_seed(0))
    gigabytes = x.numel() * 4 / 1e9
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"input {args.rows}x{args.cols} fp32 ({gigabytes * 1e3:.0f} MB), median of {args.runs}")
    print(f"{'format':<8} {'quantise ms':>12} {'GB/s':>7} {'dequantise ms':>14} {'GB/s':>7}")

    cases: list[tuple[str, Callable[[], tuple], Callable[[tuple], torch.Tensor]]] = [
        ("MXFP4", lambda: quantize_mx(x, "fp4"), lambda q: dequantize_mx(*q, "fp4")),
        ("MXFP8", lambda: quantize_mx(x, "fp8_e4m3"), lambda q: dequantize_mx(*q, "fp8_e4m3")),
        ("NVFP4", lambda: quantize_nvfp4(x), lambda q: dequantize_nvfp4(*q)),
    ]
    for name, quantise, dequantise in cases:
        q = quantise()
        tq = median_seconds(quantise, args.runs)
        td = median_seconds(lambda: dequantise(q), args.runs)
        print(f"{name:<8} {tq * 1e3:>12.1f} {gigabytes / tq:>7.2f} {td * 1e3:>14.1f} {gigabytes / td:>7.2f}")


if __name__ == "__main__":
    main()
