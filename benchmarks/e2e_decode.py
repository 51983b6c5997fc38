"""Decode tokens/s inside transformers: kernelslot installed vs transformers' own experts paths.

Models with real layer widths and few layers (random weights, built offline):

- ``minimax-m3``: MiniMax-M3 text model, bf16, H 6144, I 3072, K 4, 64 q / 4 kv heads of 128,
  shared expert; E is reduced (default 16 of 128) so two layers fit in a shared box's memory.
- ``gpt-oss``: GPT-OSS-20B, H 2880, I 2880, E 32, K 4, 64 q / 8 kv heads of 64; the expert
  weights hold MXFP4 values in bf16 (what ``Mxfp4Config(dequantize=True)`` loads on a CPU);
  transformers runs them in bf16, kernelslot re-quantises them losslessly to MXFP4 for the
  native kernels.

For each model one process runs, interleaved over ``--reps`` repetitions, a batch-1 decode of
``--steps`` tokens with every transformers experts implementation that runs here (``eager``,
``batched_mm``, ``grouped_mm``) and with ``install(model)``; the same model object and weights
serve every variant (``set_experts_implementation`` switches them). Reported per variant: the
median decode step, tokens/s, and the per-token split (experts / attention / rest) from module
hooks; the MoE speedup of kernelslot against the fastest transformers path; and the adapter's
own overhead (the kernelslot experts call with the kernel replaced by a no-op, times the number
of layers) as a fraction of the decode step.

With ``--bundle DIR`` it measures where a bundle runs instead: the same bundle installed with
``trust="sandbox"`` (the sandboxed executor, audits on: the default) and ``trust="in-process"``
(audits on too), interleaved over ``--reps`` installations each, and reports the decode step and
experts time of both and their ratio (``benchmarks/bundles/builtin_experts``: kernelslot's own
kernel as a bundle, so the difference is the executor's round trip, staging copies and audits).

Usage: python benchmarks/e2e_decode.py [--model minimax-m3|gpt-oss|all] [--layers N]
       [--experts N] [--steps N] [--reps N] [--bundle DIR] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch

from kernelslot.engines.transformers import install
from kernelslot.engines.transformers.installation import experts_modules
from kernelslot.engines.transformers.models import build_model
from kernelslot.engines.transformers.mxfp4 import snap_to_mxfp4

STOCK = ("eager", "batched_mm", "grouped_mm")


def _sizes(model: str, experts: int, layers: int) -> dict:
    if model == "minimax-m3":
        return dict(hidden=6144, inter=3072, experts=experts or 16, top_k=4, layers=layers, heads=64, kv_heads=4,
                    head_dim=128, vocab=2048)
    return dict(hidden=2880, inter=2880, experts=experts or 32, top_k=4, layers=layers, heads=64, kv_heads=8,
                head_dim=64, vocab=2048)


class Split:
    """Wall time spent inside experts and attention modules (forward pre/post hooks)."""

    def __init__(self, model: torch.nn.Module):
        self.totals = {"experts": 0.0, "attention": 0.0}
        self.handles = []
        for name, m in model.named_modules():
            kind = "experts" if m in {e for _, e in experts_modules(model)} else (
                "attention" if name.endswith("self_attn") else None)
            if kind:
                self.handles.append(m.register_forward_pre_hook(self._start))
                self.handles.append(m.register_forward_hook(self._stop(kind)))
        self._t0: dict[int, float] = {}

    def _start(self, module, args):
        self._t0[id(module)] = time.perf_counter()

    def _stop(self, kind):
        def hook(module, args, out):
            self.totals[kind] += time.perf_counter() - self._t0.pop(id(module))
        return hook

    def reset(self) -> None:
        self.totals = {k: 0.0 for k in self.totals}


def decode(model, split: Split, steps: int) -> dict:
    ids = torch.randint(0, model.config.vocab_size, (1, 4))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache, tok = out.cache, out.logits[:, -1].argmax(-1)
        times, ex, at = [], [], []
        for _ in range(steps):
            split.reset()
            t0 = time.perf_counter()
            out = model(input_ids=tok[:, None], cache=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            ex.append(split.totals["experts"])
            at.append(split.totals["attention"])
            cache, tok = out.cache, out.logits[:, -1].argmax(-1)
    return {"step": times, "experts": ex, "attention": at}


def adapter_overhead(model, state_module, reps: int = 201) -> float:
    """Median seconds the kernelslot experts call spends outside the kernel: the same call with
    the built-in kernel replaced by a no-op (weight-key check, id mapping, descriptor, receipts,
    output allocation)."""
    from kernelslot.engines.transformers import experts as adapter

    st = state_module._kernelslot_experts
    h = torch.randn(1, st.hidden_size, dtype=state_module.gate_up_proj.dtype)
    ids = torch.randperm(st.num_experts)[: model.config.num_experts_per_tok][None]
    w = torch.rand(ids.shape).softmax(-1).to(h.dtype)
    real, adapter.fused_experts_forward = adapter.fused_experts_forward, lambda *a, **k: None
    times = []
    try:
        with torch.no_grad():
            for _ in range(reps):
                t0 = time.perf_counter()
                st(state_module, h, ids, w)
                times.append(time.perf_counter() - t0)
    finally:
        adapter.fused_experts_forward = real
    return statistics.median(times)


def run(name: str, layers: int, experts: int, steps: int, reps: int) -> dict:
    t0 = time.perf_counter()
    model = build_model(name, dtype=torch.bfloat16, sizes=_sizes(name, experts, layers), weight_std=0.02)
    fmt = "dense"
    if name == "gpt-oss":
        fmt = "mxfp4"
        with torch.no_grad():
            for _, m in experts_modules(model):
                for e in range(m.gate_up_proj.shape[0]):  # contraction dims are dim 1 in GPT-OSS' layout
                    m.gate_up_proj[e].copy_(snap_to_mxfp4(m.gate_up_proj[e].T).T)
                    m.down_proj[e].copy_(snap_to_mxfp4(m.down_proj[e].T).T)
    print(f"[{name}] built in {time.perf_counter() - t0:.0f}s", flush=True)
    t0 = time.perf_counter()
    handle = install(model, weight_format=fmt)  # prepares every layer up front
    print(f"[{name}] install (prepare, {fmt}) {time.perf_counter() - t0:.1f}s", flush=True)
    split = Split(model)
    runs: dict[str, list[dict]] = {k: [] for k in (*STOCK, "kernelslot")}
    for rep in range(reps):
        for impl in (*STOCK, "kernelslot"):
            model.set_experts_implementation(impl)
            try:
                runs[impl].append(decode(model, split, steps))
            except Exception as exc:  # an implementation that does not run on this CPU
                runs[impl] = [{"error": f"{type(exc).__name__}: {exc}"}]
    overhead = adapter_overhead(model, experts_modules(model)[0][1])
    handle.uninstall()
    result = {"model": name, "format": fmt, "sizes": _sizes(name, experts, layers), "variants": {}}
    for impl, rs in runs.items():
        if not rs or "error" in rs[0]:
            result["variants"][impl] = {"error": rs[0]["error"] if rs else "not run"}
            continue
        med = {k: statistics.median(v for r in rs for v in r[k][1:]) for k in ("step", "experts", "attention")}
        med["rest"] = med["step"] - med["experts"] - med["attention"]
        med["tokens_per_s"] = 1.0 / med["step"]
        result["variants"][impl] = med
    stock = {k: v for k, v in result["variants"].items() if k in STOCK and "error" not in v}
    fastest = min(stock, key=lambda k: stock[k]["experts"])
    ks = result["variants"]["kernelslot"]
    result["fastest_stock"] = fastest
    result["moe_speedup"] = stock[fastest]["experts"] / ks["experts"]
    result["step_speedup"] = stock[fastest]["step"] / ks["step"]
    result["adapter_overhead_s"] = overhead  # per experts call
    result["adapter_overhead_per_step"] = overhead * layers / ks["step"]
    return result


def _build(name: str, layers: int, experts: int) -> tuple[torch.nn.Module, str]:
    model = build_model(name, dtype=torch.bfloat16, sizes=_sizes(name, experts, layers), weight_std=0.02)
    return model, "dense"


def run_bundle(name: str, bundle: str, layers: int, experts: int, steps: int, reps: int) -> dict:
    """The bundle served from the executor vs in-process (see the module docstring)."""
    model, _ = _build(name, layers, experts)
    split = Split(model)
    runs: dict[str, list[dict]] = {"sandbox": [], "in-process": []}
    setup: dict[str, list[float]] = {"sandbox": [], "in-process": []}
    counters: dict[str, dict] = {}
    for rep in range(reps):
        for trust in (("sandbox", "in-process") if rep % 2 == 0 else ("in-process", "sandbox")):
            t0 = time.perf_counter()
            handle = install(model, bundle=bundle, trust_unverified=True, trust=trust)
            setup[trust].append(time.perf_counter() - t0)
            runs[trust].append(decode(model, split, steps))
            counters[trust] = handle.counters()
            if handle.mismatches():
                raise SystemExit(f"audit mismatch serving {bundle} ({trust}): {handle.mismatches()[0].describe()}")
            handle.uninstall()
    result = {"model": name, "bundle": bundle, "sizes": _sizes(name, experts, layers), "variants": {}, "counters": counters}
    for trust, rs in runs.items():
        med = {k: statistics.median(v for r in rs for v in r[k][1:]) for k in ("step", "experts")}
        med["install_s"] = statistics.median(setup[trust])
        result["variants"][trust] = med
    v = result["variants"]
    result["step_ratio"] = v["sandbox"]["step"] / v["in-process"]["step"]
    result["experts_ratio"] = v["sandbox"]["experts"] / v["in-process"]["experts"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="all", choices=("all", "minimax-m3", "gpt-oss"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=0, help="experts per layer (default 16 MiniMax-M3, 32 GPT-OSS)")
    ap.add_argument("--steps", type=int, default=6, help="decode steps per run (the first is dropped)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    ap.add_argument("--bundle", metavar="DIR", help="compare this bundle served from the executor vs in-process")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    results = []
    if args.bundle:
        for name in (("minimax-m3", "gpt-oss") if args.model == "all" else (args.model,)):
            r = run_bundle(name, args.bundle, args.layers, args.experts, args.steps, args.reps)
            results.append(r)
            print(f"\n{name}: {args.bundle}, {args.layers} layers, {r['sizes']['experts']} experts (machine shared)")
            for trust, v in r["variants"].items():
                print(f"  {trust:11s} step {1e3 * v['step']:8.2f} ms  experts {1e3 * v['experts']:8.2f} ms  "
                      f"install {v['install_s']:.1f} s")
            print(f"  sandbox / in-process: step x{r['step_ratio']:.3f}, experts x{r['experts_ratio']:.3f}")
            print(f"  counters (sandbox): {json.dumps(r['counters']['sandbox'])[:300]}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        return
    for name in (("minimax-m3", "gpt-oss") if args.model == "all" else (args.model,)):
        r = run(name, args.layers, args.experts, args.steps, args.reps)
        results.append(r)
        print(f"\n{name} ({r['format']} experts for kernelslot; {args.layers} layers; machine shared)")
        print(f"  {'variant':12s} {'tok/s':>7s} {'step ms':>8s} {'experts':>8s} {'attn':>7s} {'rest':>7s}")
        for impl, v in r["variants"].items():
            if "error" in v:
                print(f"  {impl:12s} not run: {v['error'][:80]}")
                continue
            print(f"  {impl:12s} {v['tokens_per_s']:7.2f} {1e3 * v['step']:8.1f} {1e3 * v['experts']:8.1f} "
                  f"{1e3 * v['attention']:7.1f} {1e3 * v['rest']:7.1f}")
        print(f"  MoE (experts) speedup vs fastest transformers path ({r['fastest_stock']}): {r['moe_speedup']:.2f}x; "
              f"decode step {r['step_speedup']:.2f}x; adapter overhead {1e6 * r['adapter_overhead_s']:.0f} us/call = "
              f"{100 * r['adapter_overhead_per_step']:.2f}% of a step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
