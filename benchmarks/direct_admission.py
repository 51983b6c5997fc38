"""Admission overhead of a sealed direct artifact: per load and per call (prints ratios and medians).

Per load: re-verifying the seal (every file hashed) + parsing and joining the stored declaration
+ ELF/DWARF admission + memfd dlopen, i.e. what a fresh worker pays once per artifact.
Per call: the referee's launcher (binding materialisation, specialisation, receipts) against a
bare ctypes call of the same admitted function with the same arguments, on a tiny call where
the kernel's own work is negligible, interleaved, medians of several repetitions.

    PYTHONPATH=src python benchmarks/direct_admission.py [--reps 7] [--calls 2000]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

import torch

from kernelslot.abi import OutputSpec, allocate_output
from kernelslot.bundle import load_bundle
from kernelslot.bundle.direct.launcher import DirectArtifact
from kernelslot.bundle.direct.seal import open_seal

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--loads", type=int, default=20)
    args = ap.parse_args()
    bundle = load_bundle(ROOT / "examples" / "direct_activation")
    seal = next(iter(bundle.seals.values()))
    x = torch.randn(1, 128)
    out = allocate_output(OutputSpec((1, 64), torch.float32), torch.device("cpu")).view
    art = DirectArtifact(seal.handle)
    fn = art.provider._calls[(0, 0)][0]  # the admitted function pointer of export 0 (float32)
    raw_args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()), *map(ctypes.c_int64, (
        1, 1, 64, 0, x.stride(0), 1, 0, out.stride(0), 1))]

    verify_s, load_s, launcher_s, bare_s = [], [], [], []
    for _ in range(args.reps):
        t = time.perf_counter()
        for _ in range(args.loads):
            open_seal(seal.path, seal.digest)
        verify_s.append((time.perf_counter() - t) / args.loads)
        t = time.perf_counter()
        for _ in range(args.loads):
            DirectArtifact(seal.handle)
        load_s.append((time.perf_counter() - t) / args.loads)
        t = time.perf_counter()
        for _ in range(args.calls):
            art(x, out)
            art.take_evidence()
        launcher_s.append((time.perf_counter() - t) / args.calls)
        t = time.perf_counter()
        for _ in range(args.calls):
            fn(*raw_args)
        bare_s.append((time.perf_counter() - t) / args.calls)
    med = statistics.median
    print(f"artifact: {seal.index['artifact']} ({len(seal.artifact)} B), {len(seal.index['files'])} sealed files")
    print(f"per load: seal re-verification {med(verify_s) * 1e3:.3f} ms; full admission (verify + parse/join + "
          f"ELF/DWARF + memfd dlopen) {med(load_s) * 1e3:.2f} ms  (medians of {args.reps} x {args.loads})")
    print(f"per call: launcher {med(launcher_s) * 1e6:.1f} us, bare ctypes call {med(bare_s) * 1e6:.1f} us, "
          f"launcher overhead {med(launcher_s) * 1e6 - med(bare_s) * 1e6:.1f} us "
          f"(ratio {med(launcher_s) / med(bare_s):.1f}x; medians of {args.reps} x {args.calls}, tiny call 1x64 float32)")


if __name__ == "__main__":
    main()
