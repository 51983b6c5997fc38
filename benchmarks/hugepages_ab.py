"""Our native MoE decode on prepared weights in 4 KiB pages against the same weights on
transparent huge pages, side by side in one process (docs/native.md, "Huge pages for the prepared
weights").

Per format, the GPT-OSS-20B expert shapes of benchmarks/moe_decode.py's --quick cases (E 32, K 4,
H = I = 2880; the 4-bit formats rotate 2 layers so the working set exceeds the LLC) are prepared
twice: once with KERNELSLOT_NATIVE_HUGEPAGES=0 (plain torch memory) and once as the kernels run by
default (memory.streamed_zeros). Every repetition routes T tokens afresh and calls both, who goes
first alternating; the table gives the medians, the ratio 4 KiB time / huge-page time (above 1 the
huge pages are faster), both copies' share of huge pages, and the load average. Outputs are
checked bit for bit between the two copies.

Usage: python benchmarks/hugepages_ab.py [--formats F,...] [--tokens T,...] [--iters N] [--threads N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_decode import ACT, QUICK_CASES, huge_page_share, random_experts, routing  # noqa: E402

from kernelslot.kernels.native import (default_threads, expert_mlp_native, native_status,  # noqa: E402
                                       prepare_native_experts, warm_thread_pool)


def prepare(w, huge: bool):
    with mock.patch.dict(os.environ, {"KERNELSLOT_NATIVE_HUGEPAGES": "1" if huge else "0"}):
        return prepare_native_experts(w)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="mxfp4,nvfp4,mxfp8,bf16", help="labels of moe_decode.py's --quick cases")
    ap.add_argument("--tokens", default="1,8,16")
    ap.add_argument("--iters", type=int, default=15, help="repetitions per row (each calls both copies)")
    ap.add_argument("--threads", type=int, default=default_threads())
    a = ap.parse_args()
    ok, isa, reason = native_status()
    if not ok:
        print(f"native path unavailable: {reason}")
        return 1
    cases = {c.label: c for c in QUICK_CASES}
    unknown = [f for f in a.formats.split(",") if f not in cases]
    if unknown:
        print(f"unknown format(s) {unknown}; choose from {sorted(cases)}")
        return 2
    print(f"ISA {isa}, {a.threads} threads, load average {os.getloadavg()[0]:.1f}")
    print(f"{'format':>12} {'T':>3} {'4K ms':>8} {'huge ms':>8} {'4K/huge':>8} {'huge share 4K/huge':>19}")
    gen = torch.Generator().manual_seed(0)
    for label in a.formats.split(","):
        c = cases[label]
        layers = [random_experts(c, gen) for _ in range(c.layers)]
        copies = {huge: [prepare(w, huge) for w in layers] for huge in (False, True)}
        del layers
        share = {huge: huge_page_share(p) for huge, p in copies.items()}
        for T in (int(t) for t in a.tokens.split(",")):
            times = {False: [], True: []}
            for i in range(a.iters):
                ids, wts = routing(T, c.E, c.K, gen)
                x = torch.randn(T, c.H, generator=gen)
                outs = {}
                for huge in ((False, True) if i % 2 else (True, False)):
                    out = torch.zeros(T, c.H)
                    warm_thread_pool(a.threads)
                    t0 = time.perf_counter()
                    expert_mlp_native(x, ids, wts, copies[huge][i % c.layers], ACT, True, c.mx_path, out,
                                      num_threads=a.threads)
                    times[huge].append(time.perf_counter() - t0)
                    outs[huge] = out
                if not torch.equal(outs[False], outs[True]):
                    print(f"{label} T={T}: the two copies gave different outputs")
                    return 1
            m4, mh = statistics.median(times[False]), statistics.median(times[True])
            fmt_share = " / ".join("?" if share[h] is None else f"{100 * share[h]:.0f}%" for h in (False, True))
            print(f"{label:>12} {T:>3} {m4 * 1e3:8.2f} {mh * 1e3:8.2f} {m4 / mh:8.3f} {fmt_share:>19}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
