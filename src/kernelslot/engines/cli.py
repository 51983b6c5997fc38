"""``kernelslot e2e``: qualify the built-ins or a bundle inside a transformers model class.

Exit status as for ``verify``: 0 pass, 1 fail, 2 bad input, 3 not run (transformers missing).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_NOT_RUN = 0, 1, 2, 3


def add_parser(sub) -> None:
    from kernelslot.engines.e2e import DTYPES
    from kernelslot.engines.transformers.models import MODEL_CLASSES

    e = sub.add_parser("e2e", help="qualify the built-ins (or a bundle) end to end inside a transformers model")
    e.add_argument("bundle", nargs="?", help="bundle directory; default: the built-in kernels")
    e.add_argument("--model", required=True, choices=MODEL_CLASSES, help="transformers model class (random weights)")
    e.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    e.add_argument("--prompts", type=int, default=4, help="number of prompts (default 4)")
    e.add_argument("--prompt-len", type=int, default=8, help="prompt length in tokens (default 8)")
    e.add_argument("--steps", type=int, default=8, help="greedy decode steps (default 8)")
    e.add_argument("--seed", type=int, default=0, help="seed of weights and prompts (default 0)")
    e.add_argument("--entropy", type=float, default=1.0,
                   help="mean next-token entropy (nats) the LM head is sharpened to (default 1.0)")
    e.add_argument("--store", metavar="FILE",
                   help="result store with verify receipts (default $KERNELSLOT_STORE, else a temporary one)")
    e.add_argument("--skip-referee", action="store_true",
                   help="install the bundle without a passing verify receipt (explicit override; reported)")
    e.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    e.set_defaults(func=cmd_e2e)


def _bad(msg: str) -> int:
    print(f"kernelslot: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def render(report) -> str:
    kl = report.kl
    lines = [f"e2e {report.model} [{report.dtype}]  qualified: {', '.join(report.qualified) or '-'}  "
             f"entropy {report.entropy:.2f} nats",
             f"  KL(pristine || candidate)  mean {kl['mean']:.3g}  p99 {kl['p99']:.3g}  max {kl['max']:.3g}",
             f"  flips {report.flips} (near-tie changes {report.near_tie_changes})  greedy agreement "
             f"{report.greedy_agreement:.3f}  first divergence {report.first_divergence}",
             "  layer rel. error (prefill) " + " ".join(f"{e:.1e}" for e in report.layer_rel_error)]
    if "floor_kl" in report.extra:
        floors = ", ".join(f"{k} {v:.2g}" for k, v in report.extra["floor_kl"].items())
        vs32 = ", ".join(f"{k} {v:.2g}" for k, v in report.extra["fp32_vs_stock_kl"].items())
        lines.append(f"  stock floor (KL vs pristine): {floors}")
        lines.append(f"  KL vs fp32: stock {vs32}; candidate {report.extra['fp32_vs_candidate_kl']['mean']:.3g}")
    for slot, table in report.counters.items():
        cells = "; ".join(f"{n}: fired {r['fired']} (decode {r['fired_decode']}) completed {r['completed']} "
                          f"fallback {r['fallback']}" for n, r in table.items() if r["fired"] or r["fallback"])
        lines.append(f"  counters {slot}: {cells or 'nothing fired'}")
    lines.append(("PASS" if report.passed else "FAIL: " + "; ".join(report.reasons)))
    return "\n".join(lines)


def cmd_e2e(args: argparse.Namespace) -> int:
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"kernelslot: e2e not run: transformers is not importable ({exc})", file=sys.stderr)
        return EXIT_NOT_RUN
    from kernelslot.engines.e2e import run_e2e
    from kernelslot.engines.qualify import default_store, qualify

    for name in ("prompts", "prompt_len"):
        if getattr(args, name) < 1:
            return _bad(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.steps < 1:
        return _bad(f"--steps must be at least 1 (a candidate must fire on a decode step), got {args.steps}")
    if not 0.0 < args.entropy < 20.0:
        return _bad(f"--entropy must be in (0, 20) nats, got {args.entropy}")
    bundle = None
    store = args.store or default_store()
    if store:
        from kernelslot.store.results import StoreError, check_store_path

        try:
            check_store_path(store)
        except StoreError as exc:
            return _bad(str(exc))
    tmp = None
    if args.bundle:
        from kernelslot.bundle import ManifestError, load_bundle

        try:
            bundle = load_bundle(args.bundle)
        except ManifestError as exc:
            return _bad(str(exc))
        if store is None:
            tmp = tempfile.TemporaryDirectory(prefix="kernelslot-e2e-")
            store = str(Path(tmp.name) / "results.sqlite")
        if not args.skip_referee:
            verdict = qualify(bundle, ("moe.fused_experts",), store)
            if not verdict:
                return _bad(f"bundle {bundle.bundle_id} has no moe.fused_experts op; e2e qualifies moe.fused_experts")
            failed = [s for s, ok in verdict.items() if not ok]
            if failed:
                print(f"FAIL: the slot referee rejected {', '.join(failed)} of {bundle.bundle_id}; nothing to qualify")
                return EXIT_FAIL
    try:
        report = run_e2e(args.model, args.dtype, bundle=bundle, store=store, trust_unverified=args.skip_referee,
                         prompts=args.prompts, prompt_len=args.prompt_len, steps=args.steps, seed=args.seed,
                         entropy=args.entropy)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.skip_referee and bundle is not None:
        report.extra["unverified"] = True
        print("e2e: --skip-referee: the bundle was installed WITHOUT a passing verify receipt", file=sys.stderr)
    print(render(report))
    if args.json:
        payload = report.to_dict()
        payload["bundle"] = {"id": bundle.bundle_id, "sha256": bundle.content_hash} if bundle else None
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str))
    return EXIT_PASS if report.passed else EXIT_FAIL
