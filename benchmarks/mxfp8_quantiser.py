"""The native MXFP8 online quantiser: its versions' cost per element, and the whole expert call
with the scalar quantiser against the vector one (MXFP4 on the MX path).

``quantiser``: each version (``portable`` = the scalar reference, ``avx2``, ``avx512``, those this
CPU runs) on a (rows, 2880) fp32 buffer (L2-resident), three output sets: ``qdq`` (the q-dq values
in place, as the bf16 / fp32 MX paths use), ``planes`` (q-dq plus the int16 planes of the integer
MX paths), ``codes`` (E4M3 and E8M0 bytes); thread CPU time, the minimum and median of --reps
calls, ns and cycles (at the nominal clock) per element.

``experts``: one process, the same prepared experts, the two sides called round-robin (the order
alternating), ``before`` = ``KERNELSLOT_NATIVE_MXFP8_SCALAR=1``, ``after`` = the vector quantiser
(the default); per run the median of --calls calls each, then the median over --runs runs and
the ratio before / after. ``hot``: one expert, H = I = 1024, every token routed to it, 1 thread,
thread CPU time; ``cold``: the GPT-OSS-20B shape (E 32, K 4, H = I = 2880, 2 layers rotated,
fresh uniform routing per call), --threads threads, wall time, the thread pool woken untimed
before each call. ``--path vnni`` sets KERNELSLOT_NATIVE_BF16_MX=0 (AVX-512 VNNI integer MX path:
planes) where the default would be the bf16 MX path (AMD: q-dq).

Usage: python benchmarks/mxfp8_quantiser.py [quantiser] [hot] [cold] [--path default|vnni]
       [--runs 5] [--reps 200] [--calls N] [--threads 2] [--tokens 8,16]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_decode import ACT, Case, cpu_mhz, random_experts  # noqa: E402

from kernelslot.kernels.native import (build, expert_mlp_native, native_status,  # noqa: E402
                                       prepare_native_experts, warm_thread_pool)
from kernelslot.kernels.native.ops import MXFP8_IMPLS  # noqa: E402


def quantiser(reps: int, rows: int = 64, n: int = 2880) -> None:
    lib, mhz = build.loaded().lib, cpu_mhz()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows * n, generator=gen) * torch.logspace(-3, 3, rows).repeat_interleave(n)
    y = torch.empty_like(x)
    N = x.numel()
    codes, ev = torch.empty(N, dtype=torch.uint8), torch.empty(N)
    sc, hi, lo = torch.empty(N // 32, dtype=torch.uint8), torch.empty(N, dtype=torch.int16), torch.empty(N, dtype=torch.int16)
    ps, hl = torch.empty(N // 16), torch.empty(N // 32, dtype=torch.uint8)
    p = lambda t: t.data_ptr()  # noqa: E731
    modes = {"qdq": lambda i: (p(y), None, None, None, None, None, None, None),
             "planes": lambda i: (p(y), None, None, None, p(hi), p(lo), p(ps), p(hl)),
             "codes": lambda i: (None, p(codes), None, p(sc), None, None, None, None)}
    print(f"== MXFP8 quantiser, {rows} x {n} fp32, 1 thread; cycles at {mhz or '?'} MHz (nominal)")
    print(f"{'outputs':>8} {'version':>9} {'ns/elem min':>12} {'med':>6} {'cyc/elem min':>13} {'med':>6}")
    for mode, args in modes.items():
        for impl in MXFP8_IMPLS:
            code = MXFP8_IMPLS.index(impl)
            if not lib.ks_isa_supported(code):
                continue
            ts = []
            for i in range(reps):
                y.copy_(x)  # q-dq writes in place (y aliases x), as the kernels do
                src = p(y) if mode != "codes" else p(x)
                t = time.thread_time_ns()
                rc = lib.ks_mxfp8_rows_hook(code, src, N, *args(i), 0)
                ts.append(time.thread_time_ns() - t)
                assert rc == 0
            lo_ns, med_ns = min(ts) / N, statistics.median(ts) / N
            f = (mhz or float("nan")) / 1e3
            print(f"{mode:>8} {impl:>9} {lo_ns:12.3f} {med_ns:6.3f} {lo_ns * f:13.2f} {med_ns * f:6.2f}", flush=True)


def experts(mode: str, runs: int, calls: int, threads: int, tokens: list[int]) -> None:
    gen = torch.Generator().manual_seed(0)
    if mode == "hot":
        n, E, K, L, nth, clock = 1024, 1, 1, 1, 1, time.thread_time
    else:
        n, E, K, L, nth, clock = 2880, 32, 4, 2, threads, time.perf_counter
    preps = [prepare_native_experts(random_experts(Case(mode, "mxfp4", E, n, n, K, L, mx_path=True), gen))
             for _ in range(L)]
    print(f"== expert call, MXFP4 on the MX path, {mode}: E {E}, K {K}, H = I = {n}, {L} layer(s), "
          f"{nth} thread(s), {calls} calls per side per run, {runs} runs; "
          f"KERNELSLOT_NATIVE_BF16_MX={os.environ.get('KERNELSLOT_NATIVE_BF16_MX', '(unset)')}")
    for T in tokens:
        med = {"before": [], "after": []}
        for r in range(runs):
            ts = {"before": [], "after": []}
            for i in range(calls):
                for side in (("before", "after") if (i + r) % 2 == 0 else ("after", "before")):
                    os.environ["KERNELSLOT_NATIVE_MXFP8_SCALAR"] = "1" if side == "before" else "0"
                    x = torch.randn(T, n, generator=gen)
                    if mode == "hot":
                        ids = torch.zeros(T, 1, dtype=torch.int32)
                    else:
                        ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).to(torch.int32)
                    w, out = torch.ones(T, K), torch.zeros(T, n)
                    if nth > 1:
                        warm_thread_pool(nth)
                    t = clock()
                    expert_mlp_native(x, ids, w, preps[i % L], ACT, True, True, out, num_threads=nth)
                    ts[side].append(clock() - t)
            for s in ts:
                med[s].append(statistics.median(ts[s]) * 1e3)
            print(f"  T={T:>2} run {r}: before {med['before'][-1]:8.3f} ms  after {med['after'][-1]:8.3f} ms  "
                  f"x{med['before'][-1] / med['after'][-1]:.3f}", flush=True)
        b, a = statistics.median(med["before"]), statistics.median(med["after"])
        print(f"T={T:>2} median of {runs}: before {b:.3f} ms  after {a:.3f} ms  before/after x{b / a:.3f}", flush=True)
    os.environ.pop("KERNELSLOT_NATIVE_MXFP8_SCALAR", None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="*", default=["quantiser", "hot", "cold"], choices=["quantiser", "hot", "cold"])
    ap.add_argument("--path", choices=("default", "vnni"), default="default")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--calls", type=int, default=None, help="calls per side per run (hot 60, cold 15)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", default="8,16")
    args = ap.parse_args(argv)
    ok, isa, reason = native_status()
    if not ok:
        print(f"native path unavailable: {reason}")
        return 1
    if args.path == "vnni":
        os.environ["KERNELSLOT_NATIVE_BF16_MX"] = "0"
    print(f"ISA {isa}; load average {os.getloadavg()[0]:.2f}")
    tokens = [int(t) for t in args.tokens.split(",")]
    for what in args.what:
        if what == "quantiser":
            quantiser(args.reps)
        else:
            experts(what, args.runs, args.calls or (60 if what == "hot" else 15), args.threads, tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
