"""``kernelslot e2e``: qualify the built-ins or a bundle inside transformers model classes.

A bundle is qualified op by op: each of its slots on each model class given (``--model all``:
every class) that has a site for it (engines/e2e_matrix.py); the rest are reported "not run" with
the reason. Exit status as for ``verify``: 0 pass (something ran, everything that ran passed),
1 fail, 2 bad input, 3 not run (nothing ran, or transformers missing).
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
    from kernelslot.engines.transformers.install_points import SLOTS
    from kernelslot.engines.transformers.models import MODEL_CLASSES

    e = sub.add_parser("e2e", help="qualify the built-ins (or a bundle) end to end inside transformers models")
    e.add_argument("bundle", nargs="?", help="bundle directory; default: the built-in kernels")
    e.add_argument("--model", required=True, choices=(*MODEL_CLASSES, "all"),
                   help="transformers model class (random weights); all: every class")
    e.add_argument("--slot", action="append", choices=(*SLOTS, "all"),
                   help="slot(s) to qualify (repeatable; all: every slot with an install point). Default: a bundle's "
                        "ops; for the built-ins, moe.fused_experts")
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


def render_cell(cell) -> str:
    if cell.report is None:
        return f"e2e {cell.model} [{cell.dtype}] {cell.slot}: {cell.status.upper()}: {cell.reason}"
    text = render(cell.report)
    if cell.status == "not run":
        text = text.rsplit("\n", 1)[0] + f"\nNOT RUN: {cell.reason}"
    return f"== {cell.slot} ==\n{text}"


def render_summary(cells) -> str:
    lines = ["summary:"]
    for c in cells:
        lines.append(f"  {c.slot:24s} {c.model:12s} {c.dtype:9s} {c.status.upper()}"
                     + (f": {c.reason}" if c.reason and c.status != "pass" else ""))
    return "\n".join(lines)


def cmd_e2e(args: argparse.Namespace) -> int:
    from kernelslot.engines.quiet import quiet_library_imports

    quiet_library_imports()
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"kernelslot: e2e not run: transformers is not importable ({exc})", file=sys.stderr)
        return EXIT_NOT_RUN
    from kernelslot.engines.e2e_matrix import exit_status, run_matrix
    from kernelslot.engines.qualify import default_store, qualify
    from kernelslot.engines.transformers.install_points import SLOTS
    from kernelslot.engines.transformers.models import MODEL_CLASSES

    for name in ("prompts", "prompt_len"):
        if getattr(args, name) < 1:
            return _bad(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.steps < 1:
        return _bad(f"--steps must be at least 1 (a candidate must fire on a decode step), got {args.steps}")
    if not 0.0 < args.entropy < 20.0:
        return _bad(f"--entropy must be in (0, 20) nats, got {args.entropy}")
    asked = None if not args.slot else (list(SLOTS) if "all" in args.slot else list(dict.fromkeys(args.slot)))
    models = list(MODEL_CLASSES) if args.model == "all" else [args.model]
    bundle = None
    store = args.store or default_store()
    if store:
        from kernelslot.store.results import StoreError, check_store_path

        try:
            check_store_path(store)
        except StoreError as exc:
            return _bad(str(exc))
    tmp = None
    rejected: tuple[str, ...] = ()
    extra_cells = []
    if args.bundle:
        from kernelslot.bundle import ManifestError, load_bundle
        from kernelslot.engines.e2e_matrix import NOT_RUN, Cell

        try:
            bundle = load_bundle(args.bundle)
        except ManifestError as exc:
            return _bad(str(exc))
        offered = list(bundle.candidates())
        slots = [s for s in offered if asked is None or s in asked]
        if not slots:
            return _bad(f"bundle {bundle.bundle_id} has no op for {', '.join(asked)}; it offers {', '.join(offered)}")
        no_point = [s for s in slots if s not in SLOTS]
        extra_cells = [Cell(s, m, args.dtype, NOT_RUN, f"no install point: kernelslot's transformers adapter has no "
                            f"call site for {s} (it serves {', '.join(SLOTS)})") for s in no_point for m in models]
        slots = [s for s in slots if s in SLOTS]
        if store is None:
            tmp = tempfile.TemporaryDirectory(prefix="kernelslot-e2e-")
            store = str(Path(tmp.name) / "results.sqlite")
        if slots and not args.skip_referee:
            verdict = qualify(bundle, tuple(slots), store)
            rejected = tuple(s for s, ok in verdict.items() if not ok)
            for s in rejected:
                print(f"FAIL: the slot referee rejected {s} of {bundle.bundle_id}; nothing of it is qualified")
    else:
        slots = asked or ["moe.fused_experts"]
    try:
        cells = run_matrix(models, slots, args.dtype, bundle=bundle, store=store, trust_unverified=args.skip_referee,
                           rejected=rejected, prompts=args.prompts, prompt_len=args.prompt_len, steps=args.steps,
                           seed=args.seed, entropy=args.entropy) + extra_cells
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.skip_referee and bundle is not None:
        for c in cells:
            if c.report is not None:
                c.report.extra["unverified"] = True
        print("e2e: --skip-referee: the bundle was installed WITHOUT a passing verify receipt", file=sys.stderr)
    for c in cells:
        print(render_cell(c))
    if len(cells) > 1:
        print(render_summary(cells))
    if args.json:
        payload = {"bundle": {"id": bundle.bundle_id, "sha256": bundle.content_hash} if bundle else None,
                   "cells": [c.to_dict() for c in cells]}
        if len(cells) == 1 and cells[0].report is not None:  # one run: its report at the top level too
            payload.update(cells[0].report.to_dict())
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str))
    return exit_status(cells)
