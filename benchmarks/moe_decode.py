"""Decode-time MoE expert MLP on CPU: the native kernels against this machine's read bandwidth,
our torch path and transformers' experts implementations.

Per case (model shape, weight format, T tokens) it prints the median wall time of one call,
the weight bytes the call must read (each distinct routed expert once), the achieved GB/s, the
fraction of this machine's read limit (``probe``: ``kernelslot.kernels.native.probe.ReadLimit``,
the best of every read method tried at the start: vector width, 1-4 streams per thread, prefetch
distance, huge pages or not; its three best methods are re-measured by one 256 MiB read after
every timed call of the row, and the row's limit is the best of their medians, so the fraction
compares rates measured under the same host conditions). A kernel or peer figure above the
row's limit is flagged ``PROBE IS WRONG`` (the limit is then not the machine's), and the
speedups over our torch path (``kernelslot.kernels.moe_block.selective_experts``) and over
transformers' ``eager`` / ``batched_mm`` / ``grouped_mm`` experts on the same weights in bf16
(dequantised for 4-bit formats). Because the machine is shared, it also prints CPU-normalised
rates (bytes over process CPU seconds per thread) for the native calls and the read probe. Routing is fresh and uniform every call; several layers'
weights are rotated so the working set exceeds the LLC (see LAYERS below).

With ``--peer-lib`` (repeatable; built by benchmarks/peer_moe.sh from an upstream ggml or an
ik_llama.cpp source tree outside this repository) every native call is interleaved with the same
routed call on each peer (upstream ggml: MUL_MAT_ID as llama.cpp runs it, MXFP8 as q8_0;
ik_llama.cpp: weights repacked to its row-interleaved types, its fused ggml_moe_up_gate, MXFP8 as
Q8_0_R8, NVFP4 as IQ4_NL_R4). Before timing, each peer's output is checked against a double
reference (``check``: relative L2 error, at most PEER_TOLERANCE). The table adds each peer's ms,
GB/s and the ratio peer time / ours (``x NAME``; above 1 we are faster) by wall time and by
process CPU time (``cpu``: robust to a shared machine; run with ``--threads 1`` for a comparison
no scheduler noise can skew); the torch and transformers comparisons are skipped in that mode.

Usage: python benchmarks/moe_decode.py [--quick] [--json FILE] [--iters N] [--threads N]
       [--no-transformers] [--peer-lib PATH] [--cycles [--formats F,...]]

``--cycles`` prints only the hot single-thread kernel cost per 32 weights (see decode_cycles).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass

import ctypes

import torch

from kernelslot.formats import quantize_mx
from kernelslot.kernels.moe_block import ScalingMode, selective_experts
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.kernels.native import (
    default_threads,
    expert_mlp_native,
    native_status,
    prepare_native_experts,
    warm_thread_pool,
)
from kernelslot.kernels.native.memory import huge_page_bytes
from kernelslot.kernels.native.probe import ReadLimit


@dataclass(frozen=True)
class Case:
    shape: str
    fmt: str
    E: int
    H: int
    I: int
    K: int
    layers: int
    note: str = ""
    mx_path: bool = False      # the block's MX path: MXFP8 activations (quantize_activations)
    transformers: bool = True  # False where a bf16 copy of the layer does not fit in memory
    gauss: bool = False        # FP8: quantised Gaussian weights instead of random codes

    @property
    def label(self) -> str:
        """The name --formats selects: the format, with -gauss for quantised Gaussian FP8 weights."""
        return self.fmt + ("-gauss" if self.gauss else "")


# MiniMax-M3 layers are large (NVFP4 4.0 GB, bf16 14.5 GB at 128 experts): one NVFP4 layer is
# used (4 random experts of 128 per token leave no useful LLC reuse), and bf16 runs 32 experts
# of the true shape (3.6 GB) to stay under ~14 GB of memory in all.
CASES = (
    Case("GPT-OSS-20B", "mxfp4", 32, 2880, 2880, 4, 4, mx_path=True),
    Case("MiniMax-M3", "nvfp4", 128, 6144, 3072, 4, 1, "1 layer (4.0 GB), no rotation; no transformers "
         "run (its bf16 copy would be 14.5 GB)", transformers=False),
    Case("MiniMax-M3", "bf16", 32, 6144, 3072, 4, 1, "32 of 128 experts (3.6 GB), 1 layer"),
)
# --quick: T = 1 and 8 for the four formats at the GPT-OSS-20B shape.
QUICK_CASES = (
    Case("GPT-OSS-20B", "mxfp4", 32, 2880, 2880, 4, 2, mx_path=True),
    Case("GPT-OSS-20B", "nvfp4", 32, 2880, 2880, 4, 2),
    Case("GPT-OSS-20B", "mxfp8", 32, 2880, 2880, 4, 1, mx_path=True),
    # realistic MXFP8 codes: random codes are 1/16 zero or subnormal, which costs ~24x on Intel
    # (denormal assists; docs/native.md, "Preliminary peer table")
    Case("GPT-OSS-20B", "mxfp8", 32, 2880, 2880, 4, 1, mx_path=True, gauss=True),
    Case("GPT-OSS-20B", "bf16", 32, 2880, 2880, 4, 1),
)
TOKENS = (1, 2, 4, 8, 16, 32)
PEER_TOLERANCE = 0.05  # the peers round activations to 8 bits (bf16 ones to bf16): ~1e-2 relative
ACT = ExpertActivation("silu")
BATCHED_MM_MAX_BYTES = 2 << 30  # batched_mm gathers one weight copy per (token, k) pair


def random_experts(c: Case, gen: torch.Generator) -> ExpertWeights:
    """Random weights in the case's format (random bytes with realistic scale ranges)."""
    E, H, I = c.E, c.H, c.I

    def u8(*shape, lo=0, hi=256):
        return torch.randint(lo, hi, shape, dtype=torch.uint8, generator=gen)
    if c.fmt == "mxfp4":
        return ExpertWeights("mxfp4", u8(E, 2 * I, H // 2), u8(E, H, I // 2),
                             u8(E, 2 * I, H // 32, lo=118, hi=123), u8(E, H, I // 32, lo=118, hi=123))
    if c.fmt in ("mxfp8", "fp8_row") and c.gauss:  # realistic codes: subnormal / zero codes are rare
        mats = [torch.randn(E, 2 * I, H, generator=gen) * 0.02, torch.randn(E, H, I, generator=gen) * 0.02]
        if c.fmt == "mxfp8":
            (gd, gs), (dd, ds) = (quantize_mx(m, "fp8_e4m3") for m in mats)
            return ExpertWeights("mxfp8", gd, dd, gs, ds)
        scales = [m.abs().amax(-1) / 448.0 for m in mats]
        gq, dq = ((m / sc.unsqueeze(-1)).to(torch.float8_e4m3fn) for m, sc in zip(mats, scales))
        return ExpertWeights("fp8_row", gq, dq, *scales)
    if c.fmt == "mxfp8":
        return ExpertWeights("mxfp8", u8(E, 2 * I, H), u8(E, H, I),
                             u8(E, 2 * I, H // 32, lo=118, hi=123), u8(E, H, I // 32, lo=118, hi=123))
    if c.fmt == "fp8_row":
        return ExpertWeights("fp8_row", u8(E, 2 * I, H).view(torch.float8_e4m3fn), u8(E, H, I).view(torch.float8_e4m3fn),
                             torch.full((E, 2 * I), 1e-4), torch.full((E, H), 1e-4))
    if c.fmt == "nvfp4":
        e4m3 = lambda *s: u8(*s, lo=0x30, hi=0x48).view(torch.float8_e4m3fn)  # 2^-1 .. 2^1
        return ExpertWeights("nvfp4", u8(E, 2 * I, H // 2), u8(E, H, I // 2), e4m3(E, 2 * I, H // 16),
                             e4m3(E, H, I // 16), torch.full((E,), 1e-2), torch.full((E,), 1e-2))
    gu = torch.empty(E, 2 * I, H, dtype=torch.bfloat16)
    dn = torch.empty(E, H, I, dtype=torch.bfloat16)
    for e in range(E):
        gu[e].normal_(0, 0.02, generator=gen)
        dn[e].normal_(0, 0.02, generator=gen)
    return ExpertWeights("dense", gu, dn)


def routing(T: int, E: int, K: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    return ids, torch.rand(T, K, generator=gen)


def cpu_seconds() -> float:
    """CPU time of this process (all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure_bandwidth(limit: ReadLimit, repeats: int = 9) -> tuple[float, float, float]:
    """(GB/s limit, relative spread, CPU-normalised GB/s) of ``repeats`` reads by the limit's kept
    methods. CPU-normalised = bytes / (process CPU seconds / threads): what the wall rate would be
    if the threads had the cores to themselves (the box is shared)."""
    rates, cpu_rates = [], []
    for _ in range(repeats):
        c = cpu_seconds()
        rates.append(limit.read())
        cpu_rates.append(limit.slice_bytes * limit.threads / max(cpu_seconds() - c, 1e-9) / 1e9)
    best = limit.limit()
    return best, (max(rates) - min(rates)) / best, statistics.median(cpu_rates)


def time_calls(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def transformers_experts(weights: ExpertWeights, c: Case):
    """A transformers experts module (Qwen3-MoE layout: gate_up (E, 2I, H), down (E, H, I))
    holding bf16 weights: shared with ``weights`` when they are bf16, else dequantised."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from kernelslot.kernels.moe_block.expert_weights import dequantize_experts
    cfg = Qwen3MoeConfig(hidden_size=c.H, moe_intermediate_size=c.I, num_experts=c.E, hidden_act="silu")
    with torch.device("meta"):
        mod = Qwen3MoeExperts(cfg)
    if weights.format == "dense" and weights.gate_up.dtype == torch.bfloat16:
        gu, dn = weights.gate_up, weights.down
    else:
        gu = torch.empty(c.E, 2 * c.I, c.H, dtype=torch.bfloat16)
        dn = torch.empty(c.E, c.H, c.I, dtype=torch.bfloat16)
        for e in range(c.E):  # per expert, to bound the fp32 temporaries
            one = ExpertWeights(weights.format, weights.gate_up[e:e + 1], weights.down[e:e + 1],
                                *(None if t is None else t[e:e + 1] for t in (
                                    weights.gate_up_scale, weights.down_scale, weights.gate_up_outer,
                                    weights.down_outer)))
            g, d = dequantize_experts(one)
            gu[e].copy_(g[0])
            dn[e].copy_(d[0])
    mod.gate_up_proj = torch.nn.Parameter(gu, requires_grad=False)
    mod.down_proj = torch.nn.Parameter(dn, requires_grad=False)
    return mod


class Peer:
    """A peer engine on the same case: benchmarks/peer/ggml_moe_peer.c (upstream ggml) or
    ik_moe_peer.c (ik_llama.cpp), built by benchmarks/peer_moe.sh, via ctypes."""

    def __init__(self, lib_path: str, c: Case, threads: int):
        lib = ctypes.CDLL(lib_path)
        lib.peer_type_for.restype = ctypes.c_int
        lib.peer_type_for.argtypes = [ctypes.c_char_p]
        lib.peer_new.restype = ctypes.c_void_p
        lib.peer_new.argtypes = [ctypes.c_int] * 6 + [ctypes.c_uint64]
        lib.peer_tokens.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.peer_run.restype = ctypes.c_double
        lib.peer_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.peer_check.restype = ctypes.c_double
        lib.peer_check.argtypes = [ctypes.c_void_p]
        lib.peer_describe.restype = ctypes.c_char_p
        lib.peer_describe.argtypes = [ctypes.c_void_p]
        lib.peer_expert_bytes.restype = ctypes.c_int64
        lib.peer_expert_bytes.argtypes = [ctypes.c_void_p]
        self.lib, self.case = lib, c
        gtype = lib.peer_type_for(c.fmt.encode())
        if gtype < 0:
            raise RuntimeError(f"peer {lib_path} has no type for {c.fmt}")
        self.handle = lib.peer_new(gtype, c.E, c.H, c.I, c.layers, threads, 12345)
        if not self.handle:
            raise RuntimeError(f"peer_new failed for {c.fmt} ({lib_path})")
        self.expert_bytes = lib.peer_expert_bytes(self.handle)
        self.describe = lib.peer_describe(self.handle).decode()
        self.name = "ik" if self.describe.startswith("ik_llama") else "ggml"
        self.check_errors: dict[int, float] = {}

    def tokens(self, T: int) -> None:
        """Build the graphs for T tokens and check the output against the reference (raises when off)."""
        if self.lib.peer_tokens(self.handle, T, self.case.K) != 0:
            raise RuntimeError("peer_tokens failed")
        err = self.lib.peer_check(self.handle)
        self.check_errors[T] = err
        if not err <= PEER_TOLERANCE:
            raise RuntimeError(f"peer {self.describe}: output at T={T} is off the reference by {err:.3g} "
                               f"(relative L2; tolerance {PEER_TOLERANCE}): not timing a wrong result")

    def run(self, layer: int, ids: torch.Tensor, weights: torch.Tensor) -> float:
        ids32, w32 = ids.to(torch.int32).contiguous(), weights.float().contiguous()
        t = self.lib.peer_run(self.handle, layer, ids32.data_ptr(), w32.data_ptr())
        if t < 0:
            raise RuntimeError("peer graph compute failed")
        return t


def probe_verdict(who: str, gbps: float, limit: float) -> str | None:
    """The flag for a figure above the row's read limit (None when it is not above)."""
    return f"{who} {gbps:.1f} GB/s > probe {limit:.1f}" if gbps > limit else None


def huge_page_share(prepared) -> float | None:
    """Fraction of the prepared tiles' bytes the kernel backs with huge pages (None: unreadable);
    KERNELSLOT_NATIVE_HUGEPAGES=0 runs ours on 4 KiB pages (docs/native.md, "Huge pages for the prepared weights")."""
    tiles = [t for p in prepared for t in (p.gate_up_tiles, p.down_tiles)]
    got = [huge_page_bytes(t.data_ptr(), t.numel()) for t in tiles]
    return None if None in got else min(1.0, sum(got) / sum(t.numel() for t in tiles))


def run_case(c: Case, tokens, iters: int, threads: int, limit: ReadLimit, cpu_bandwidth: float,
             gen: torch.Generator, with_transformers: bool, peer_libs: list[str] | None = None) -> list[dict]:
    t0 = time.perf_counter()
    layers = [random_experts(c, gen) for _ in range(c.layers)]
    prepared = [prepare_native_experts(w) for w in layers]
    peers: list[Peer] = []
    if peer_libs:  # the torch / transformers comparisons are skipped: free the source weights
        layers = None
        gc.collect()
        peers = [Peer(lib, c, threads) for lib in peer_libs]
    per_expert = prepared[0].weight_bytes_per_expert
    huge = huge_page_share(prepared)
    print(f"\n== {c.shape} {c.label}{' (MX path: MXFP8 activations)' if c.mx_path else ''}: E={c.E} H={c.H} I={c.I} K={c.K}, {c.layers} layer(s) rotated, "
          f"{per_expert / 1e6:.1f} MB/expert {('(' + c.note + ')') if c.note else ''}"
          f"; our weights on huge pages: {'?' if huge is None else f'{100 * huge:.0f}%'}"
          f" [setup {time.perf_counter() - t0:.0f} s]")
    for pe in peers:
        print(f"   peer {pe.name}: {pe.describe}")
    tf = transformers_experts(layers[0], c) if with_transformers and c.transformers and not peers else None
    torch_budget_ok = not peers
    records = []
    header = (f"{'T':>3} {'median ms':>10} {'MB read':>8} {'GB/s':>6} {'probe':>6} {'of bw':>6} {'spread':>6} "
              f"{'cpuGB/s':>7} {'of cbw':>6}"
              + ("".join(f" {pe.name + ' ms':>8} {pe.name + 'GB/s':>8} {'x ' + pe.name:>7} {'cpu':>5} {'check':>7}"
                         for pe in peers) if peers else
                 f" {'x torch':>8} {'x eager':>8} {'x bmm':>8} {'x gmm':>8}"))
    print(header)
    for T in tokens:
        x = torch.randn(T, c.H, generator=gen)
        routes = [routing(T, c.E, c.K, gen) for _ in range(iters)]
        out = torch.zeros(T, c.H)

        def native(i):
            ids, w = routes[i]
            expert_mlp_native(x, ids, w, prepared[i % c.layers], ACT, True, c.mx_path, out, num_threads=threads)
        native(0)
        for pe in peers:
            pe.tokens(T)  # checks its output against the reference first
            pe.run(0, *routes[0])
        times, peer_times, cpu = [], [[] for _ in peers], [0.0] * (1 + len(peers))

        def ours(i):
            warm_thread_pool(threads)  # untimed: the probe read or a peer's call ran since ours
            c0 = cpu_seconds()
            times.extend(time_calls(lambda _: native(i), 1))
            cpu[0] += cpu_seconds() - c0

        def theirs(j):
            def call(i):
                c0 = cpu_seconds()
                peer_times[j].append(peers[j].run(i % c.layers, *routes[i]))  # its threads are woken untimed too
                cpu[1 + j] += cpu_seconds() - c0
            return call
        calls = [ours] + [theirs(j) for j in range(len(peers))]
        for i in range(iters):  # on the same routing: each side in turn, who goes first rotating; a probe read
            for k in range(len(calls)):
                calls[(i + k) % len(calls)](i)
            limit.read()
        cpu_per_call = cpu[0] / iters  # ru_* resolution
        med = statistics.median(times)
        row_bw = limit.limit()
        distinct = statistics.median(len(torch.unique(r[0])) for r in routes)
        nbytes = int(distinct * per_expert)
        gbps = nbytes / med / 1e9
        cpu_gbps = nbytes * threads / max(cpu_per_call, 1e-9) / 1e9
        spread = (max(times) - min(times)) / med
        n_slow = max(3, iters // 5)
        flags = [probe_verdict("ours", gbps, row_bw)]

        def torch_path(i):
            ids, w = routes[i]
            selective_experts(layers[i % c.layers], x, ids, w, ACT, ScalingMode.POST_SCALE, c.mx_path)
        speed = {"torch": None}
        if torch_budget_ok:  # the torch path dequantises every routed expert per call
            t_torch = statistics.median(time_calls(torch_path, n_slow))
            speed["torch"] = t_torch / med
            torch_budget_ok = t_torch < 20.0
        if tf is not None:
            xb = x.to(torch.bfloat16)
            for impl in ("eager", "batched_mm", "grouped_mm"):
                if impl == "batched_mm" and T * c.K * per_expert * 4 > BATCHED_MM_MAX_BYTES:
                    speed[impl] = None  # would gather T*K bf16 expert copies
                    continue
                tf.config._experts_implementation = impl
                try:
                    with torch.no_grad():
                        tt = statistics.median(time_calls(
                            lambda i: tf(xb, routes[i][0], routes[i][1].to(torch.bfloat16)), n_slow))
                    speed[impl] = tt / med
                except Exception as exc:  # an implementation that does not run on CPU
                    print(f"   transformers {impl} failed on CPU: {type(exc).__name__}: {exc}")
                    speed[impl] = None
        fmtx = lambda v: f"{v:8.1f}" if v is not None else f"{'-':>8}"
        rec = {"shape": c.shape, "format": c.fmt, "label": c.label, "mx_path": c.mx_path, "T": T, "median_s": med, "weight_bytes": nbytes,
               "huge_page_share": huge,
               "gbps": gbps, "fraction_of_bandwidth": gbps / row_bw, "read_probe_gbps": row_bw,
               "read_probe_methods": [m.name for m in limit.top],
               "speedup_vs_torch": speed["torch"],
               "speedup_vs_transformers": {k: v for k, v in speed.items() if k != "torch"},
               "spread": spread, "cpu_normalised_gbps": cpu_gbps,
               "cpu_normalised_fraction": cpu_gbps / cpu_bandwidth, "iters": iters, "threads": threads, "layers": c.layers,
               "num_experts": c.E, "note": c.note, "peers": {}}
        cols = ""
        for j, pe in enumerate(peers):
            pmed = statistics.median(peer_times[j])
            pgbps = distinct * pe.expert_bytes / pmed / 1e9
            flags.append(probe_verdict(pe.name, pgbps, row_bw))
            cols += (f" {pmed * 1e3:8.2f} {pgbps:8.1f} {pmed / med:7.2f} {cpu[1 + j] / iters / cpu_per_call:5.2f}"
                     f" {pe.check_errors[T]:7.1e}")
            rec["peers"][pe.name] = {"describe": pe.describe, "median_s": pmed, "gbps": pgbps,
                                     "weight_bytes": int(distinct * pe.expert_bytes), "speedup_vs_peer": pmed / med,
                                     "cpu_speedup_vs_peer": cpu[1 + j] / iters / cpu_per_call,
                                     "times_s": peer_times[j], "check_error": pe.check_errors[T]}
        flags = [f for f in flags if f]
        rec["times_s"], rec["probe_is_wrong"] = times, flags
        if not peers:
            cols = (f" {fmtx(speed['torch'])} {fmtx(speed.get('eager'))} {fmtx(speed.get('batched_mm'))} "
                    f"{fmtx(speed.get('grouped_mm'))}")
        print(f"{T:>3} {med * 1e3:10.2f} {nbytes / 1e6:8.1f} {gbps:6.1f} {row_bw:6.1f} {gbps / row_bw:6.0%} {spread:6.0%} "
              f"{cpu_gbps:7.1f} {cpu_gbps / cpu_bandwidth:6.0%}" + cols
              + (f"   PROBE IS WRONG: {'; '.join(flags)}" if flags else ""), flush=True)
        records.append(rec)
    del layers, prepared, tf, peers
    gc.collect()
    return records


def cpu_mhz() -> float | None:
    """The nominal clock from /proc/cpuinfo (None elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(float(line.split(":")[1]) for line in f if line.startswith("cpu MHz"))
    except (OSError, StopIteration, ValueError):
        return None


CYCLE_FORMATS = ("mxfp4", "nvfp4", "mxfp8", "bf16")
# also accepted by --formats: fp8_row (random codes), mxfp8-gauss / fp8_row-gauss (quantised Gaussian)


def decode_cycles(gen: torch.Generator, iters: int, formats=CYCLE_FORMATS) -> list[dict]:
    """Kernel cost per 32 weights, hot: one thread, one expert (H = I = 1024, L2/L3-resident),
    all T tokens routed to it; thread CPU time (robust to a shared machine), minimum of
    ``iters`` calls, so call overheads are included. ``marginal``: the same at H = I = 2048
    minus H = I = 1024, per extra 32 weights — the per-call overheads (Python, allocation,
    thread pool) cancel; per-element work (activation quantisation, epilogue) stays. Cycles at
    the nominal clock. ``mxfp8`` / ``fp8_row`` use random codes (1/16 with exponent 0, i.e. zero or
    subnormal); the ``-gauss`` variants quantised Gaussian weights (MXFP8: on the MX path)."""
    mhz, records = cpu_mhz(), []
    print(f"\n== decode cost, hot, 1 thread (1 expert); cycles at {mhz or '?'} MHz")
    print(f"{'format':>12} {'T':>3} {'ns/32w':>7} {'cyc/32w':>8} {'cyc/32w/token':>14} {'marginal':>9}")

    def best(prep, T, n):
        x, out = torch.randn(T, n, generator=gen), torch.zeros(T, n)
        ids, w = torch.zeros(T, 1, dtype=torch.int32), torch.ones(T, 1)
        ts = []
        for _ in range(iters):
            t = time.thread_time()
            expert_mlp_native(x, ids, w, prep, ACT, True, prep_mx[id(prep)], out, num_threads=1)
            ts.append(time.thread_time() - t)
        return min(ts)
    prep_mx = {}
    for fmt in formats:
        preps = {}
        base = fmt.removesuffix("-gauss")
        for n in (1024, 2048):
            c = Case("hot", base, 1, n, n, 1, 1, mx_path=base in ("mxfp4", "mxfp8"), gauss=fmt.endswith("-gauss"))
            preps[n] = prepare_native_experts(random_experts(c, gen))
            prep_mx[id(preps[n])] = c.mx_path
        for T in (1, 2, 4, 8, 16):
            t1, t2 = best(preps[1024], T, 1024), best(preps[2048], T, 2048)
            blocks1, blocks2 = 3 * 1024 * 1024 / 32, 3 * 2048 * 2048 / 32
            ns, marg = t1 / blocks1 * 1e9, (t2 - t1) / (blocks2 - blocks1) * 1e9
            cyc = ns * mhz / 1e3 if mhz else float("nan")
            mcyc = marg * mhz / 1e3 if mhz else float("nan")
            print(f"{fmt:>12} {T:>3} {ns:7.2f} {cyc:8.2f} {cyc / T:14.2f} {mcyc:9.2f}", flush=True)
            records.append({"format": fmt, "T": T, "ns_per_32_weights": ns, "cycles_per_32_weights": cyc,
                            "marginal_cycles_per_32_weights": mcyc})
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="GPT-OSS-20B shape, MXFP4 / NVFP4 / MXFP8 (random codes; mxfp8-gauss: quantised Gaussian) / bf16, T=1 and T=8 only")
    ap.add_argument("--peer-lib", metavar="SO", action="append",
                    help="peer library built by benchmarks/peer_moe.sh (repeat for several peers)")
    ap.add_argument("--cycles", action="store_true", help="only the hot decode cost in cycles per 32 weights")
    ap.add_argument("--formats", metavar="F,...",
                    help="comma-separated formats: the cases to run (default: all), or with --cycles the "
                         "formats to probe (default " + ",".join(CYCLE_FORMATS) + "; also fp8_row, "
                         "mxfp8-gauss, fp8_row-gauss)")
    ap.add_argument("--json", metavar="FILE", help="write one record per case to FILE")
    ap.add_argument("--tokens", metavar="T,...",
                    help="comma-separated batch sizes for the chosen cases (default 1,8 with --quick, else "
                         + ",".join(map(str, TOKENS)) + "); e.g. --quick --tokens 1,2,4,8,16 with the peer")
    ap.add_argument("--iters", type=int, default=21, help="native calls per case (median)")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--no-transformers", action="store_true", help="skip transformers' implementations")
    args = ap.parse_args(argv)
    ok, isa, reason = native_status()
    if not ok:
        print(f"native path unavailable: {reason}", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    if args.cycles:
        formats = tuple(args.formats.split(",")) if args.formats else CYCLE_FORMATS
        cycles = decode_cycles(gen, max(args.iters, 20), formats)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"isa": isa, "decode_cycles": cycles}, f, indent=1)
        return 0
    t0 = time.perf_counter()
    limit = ReadLimit.measure(args.threads)
    print(f"read limit: {len(limit.medians)} read methods tried over 256 MiB slices of 1 GiB buffers "
          f"({time.perf_counter() - t0:.0f} s), {args.threads} threads; best medians: "
          + ", ".join(f"{n} {v:.1f}" for n, v in limit.table(top=5))
          + f"; THP buffer backed by huge pages: "
          + (f"{(limit.buffers[True].huge_bytes() or 0) / limit.buffers[True].nbytes:.0%}" if True in limit.buffers
             else "not kept"))
    bw, bw_spread, cbw = measure_bandwidth(limit)
    print(f"native ISA {isa}, {args.threads} threads; read limit {bw:.1f} GB/s "
          f"(best median of {', '.join(m.name for m in limit.top)}, spread {bw_spread:.0%} over 9 reads of 256 MiB; "
          f"CPU-normalised {cbw:.1f} GB/s); load average {os.getloadavg()[0]:.1f}")
    cases = QUICK_CASES if args.quick else CASES
    if args.formats:
        wanted = args.formats.split(",")
        unknown = sorted(set(wanted) - {c.label for c in cases})
        if unknown:
            ap.error(f"--formats: no {'--quick ' if args.quick else ''}case has format(s) {', '.join(unknown)} "
                     f"(choose from {', '.join(sorted({c.label for c in cases}))})")
        cases = tuple(c for c in cases if c.label in wanted)
    tokens = (1, 8) if args.quick else TOKENS
    if args.tokens:
        try:
            tokens = tuple(int(t) for t in args.tokens.split(","))
        except ValueError:
            ap.error(f"--tokens: expected comma-separated integers, got {args.tokens!r}")
        if any(not 1 <= t <= 64 for t in tokens):
            ap.error(f"--tokens: every batch size must be in 1..64 (the native domain), got {args.tokens!r}")
    records = []
    for c in cases:
        records += run_case(c, tokens, args.iters, args.threads, limit, cbw, gen, not args.no_transformers,
                            args.peer_lib)
    bw_end, _, cbw_end = measure_bandwidth(limit)
    wrong = [f"{r['label']} T={r['T']}: {f}" for r in records for f in r["probe_is_wrong"]]
    print(f"\nPROBE IS WRONG in {len(wrong)} row(s): " + "; ".join(wrong) if wrong else
          "\nno kernel or peer figure above the read limit")
    print(f"\nread bandwidth at the end: {bw_end:.1f} GB/s (start {bw:.1f}); CPU-normalised "
          f"{cbw_end:.1f} (start {cbw:.1f}); load average {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bandwidth_gbps": bw, "bandwidth_end_gbps": bw_end, "cpu_normalised_bandwidth_gbps": cbw,
                       "read_methods": limit.table(), "probe_is_wrong": wrong,
                       "isa": isa, "cases": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
