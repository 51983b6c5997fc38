"""The ``kernelslot`` command.

``kernelslot slots``            the catalog: signatures, comparators, profiles
``kernelslot scan BUNDLE``      manifest and static checks only (no candidate code runs)
``kernelslot verify [BUNDLE]``  the referee; with no bundle, the built-in kernels of every slot
``kernelslot e2e [BUNDLE] --model M``  end-to-end qualification inside a transformers model (engines/cli.py)

Exit status: 0 when everything passed, 1 when a verification failed, 2 for bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from kernelslot.slots import CATALOG, Candidate, UnknownSlotError, get_slot
from kernelslot.slots.base import dtype_name
from kernelslot.slots.models import MODELS

DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class UsageError(Exception):
    """Bad command-line input: reported on one line, exit status 2."""


def _cmd_slots(args: argparse.Namespace) -> int:
    rows = []
    for name in sorted(CATALOG):
        d = CATALOG[name]
        rows.append({
            "slot": name, "kind": d.slot.kind.value, "signature": d.slot.signature(),
            "comparator": d.describe_comparator(), "profiles": len(d.profiles),
            "dtypes": [dtype_name(t) for t in d.dtypes], "models": sorted({p.model for p in d.profiles}),
            "summary": d.slot.summary,
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['slot']}  ({r['kind']})")
        print(f"    {r['signature']}")
        if r["summary"]:
            print(f"    {r['summary']}")
        print(f"    comparator: {r['comparator']}")
        print(f"    {r['profiles']} profiles; dtypes {', '.join(r['dtypes'])}; models {', '.join(r['models'])}")
    return 0


def _cmd_scan(args: argparse.Namespace) -> int:
    from kernelslot.bundle import load_bundle

    bundle = load_bundle(args.bundle)
    m = bundle.manifest
    print(f"bundle {m.bundle_id}  abi {m.abi_version}  sha256 {bundle.content_hash}")
    if m.competition:
        print("competition: " + ", ".join(f"{k}={v}" for k, v in m.competition.items()))
    for row in m.ops:
        model = f" model={row.model}" if row.model else ""
        print(f"  {row.label:40s} {row.source}:{row.entry}  domain: {row.domain.describe()}"
              f"{' graph_safe' if row.graph_safe else ''}{model}")
    print(f"OK: {len(m.ops)} op row(s), static checks passed")
    return 0


def _options(args: argparse.Namespace):
    from kernelslot.verify import VerifyOptions

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False)")
    dtypes = tuple(DTYPE_NAMES[d] for d in args.dtype) if args.dtype else None
    if args.model and args.model not in MODELS:
        raise UsageError(f"--model {args.model!r} is unknown; known: {', '.join(MODELS)}")
    if args.replays < 2:
        raise UsageError("--replays must be at least 2 (fresh-input replay catches cached results)")
    if any(w < 2 for w in args.world_size or []):
        raise UsageError("--world-size must be at least 2 (collective slots run one process per rank)")
    if args.seeds < 1:
        raise UsageError(f"--seeds must be at least 1, got {args.seeds}")
    untrusted = args.bundle is not None
    if args.random_seeds or (untrusted and args.seed_base is None):
        # a bundle's inputs are drawn from a seed it cannot anticipate (printed for reproduction)
        args.seed_base = int.from_bytes(os.urandom(4), "little")
        print(f"kernelslot: seeds drawn at random; reproduce with --seed-base {args.seed_base}", file=sys.stderr)
    seed_base = args.seed_base or 0
    seeds = tuple(range(seed_base, seed_base + args.seeds))
    return VerifyOptions(device=args.device, dtypes=dtypes, seeds=seeds, replays=args.replays,
                         profiles=tuple(args.profile) if args.profile else None, model=args.model, time=args.time,
                         world_sizes=tuple(args.world_size) if args.world_size else VerifyOptions.world_sizes,
                         collective_timeout_s=args.timeout, extra_replays=2 if untrusted else 0)


def _targets(args: argparse.Namespace) -> tuple[list[tuple[str, list[Candidate]]], object | None]:
    if args.bundle:
        from kernelslot.bundle import load_bundle

        bundle = load_bundle(args.bundle)
        cands = bundle.candidates()
        for s in args.slot or []:
            if s not in cands:
                raise UsageError(f"--slot {s}: the bundle has no op for it; it has {', '.join(sorted(cands))}")
        return [(s, c) for s, c in cands.items() if not args.slot or s in args.slot], bundle
    names = args.slot or sorted(CATALOG)
    return [(n, list(get_slot(n).builtin_candidates())) for n in names], None


def _make_runner(args: argparse.Namespace, bundle: object | None):
    """Bundles run isolated in a worker process by default; built-in kernels are trusted code."""
    from kernelslot.verify.worker import make_runner

    isolate = args.isolate if args.isolate is not None else bundle is not None
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    return make_runner(isolate, args.timeout, device=args.device)


def _cmd_verify(args: argparse.Namespace) -> int:
    from kernelslot.verify import verify_slot
    from kernelslot.verify.render import render_slot

    targets, bundle = _targets(args)  # a bad bundle is reported before anything else is said
    opts = _options(args)
    runner = _make_runner(args, bundle)
    store = run_id = None
    if args.store:
        from kernelslot.store import ResultStore

        store = ResultStore(args.store)
        run_id = store.start_run(" ".join(sys.argv), args.device, runner.name,
                                 getattr(bundle, "bundle_id", None), getattr(bundle, "content_hash", None))
    reports = []
    started = time.perf_counter()
    tty = sys.stderr.isatty()
    try:
        for i, (slot_name, cands) in enumerate(targets, 1):
            defn = get_slot(slot_name)
            if not args.quiet:
                print(f"[{i}/{len(targets)}] verifying {slot_name} ...", file=sys.stderr, flush=True)

            def progress(r, _slot=slot_name):
                if tty and not args.quiet:
                    print(f"    {r.profile}[{r.dtype}] {r.status}", file=sys.stderr, flush=True)

            report = verify_slot(defn, cands, opts, runner=runner, progress=progress)
            reports.append(report)
            if store:
                store.add_report(run_id, report)
            print(render_slot(report, defn.describe_comparator()))
            print()
    finally:
        runner.close()
        if store:
            store.close()
    elapsed = time.perf_counter() - started
    failed = [r.slot for r in reports if not r.passed]
    summary = f"{len(reports) - len(failed)}/{len(reports)} slots passed in {elapsed:.1f}s"
    print(("PASS: " if not failed else "FAIL: ") + summary + (f"; failed: {', '.join(failed)}" if failed else ""))
    if args.json:
        payload = {"passed": not failed, "elapsed_s": elapsed, "device": args.device, "runner": runner.name,
                   "seeds": list(opts.seeds),
                   "bundle": {"id": bundle.bundle_id, "sha256": bundle.content_hash} if bundle else None,
                   "slots": [r.to_dict() for r in reports]}
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str))
    return 0 if not failed else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelslot", description="Verify kernels against inference-engine slot contracts.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("slots", help="list the slot catalog")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=_cmd_slots)
    s = sub.add_parser("scan", help="check a bundle's manifest and sources without running them")
    s.add_argument("bundle")
    s.set_defaults(func=_cmd_scan)
    v = sub.add_parser("verify", help="verify a bundle (or, with none, the built-in kernels)")
    v.add_argument("bundle", nargs="?", help="bundle directory (holding manifest.toml); default: built-in kernels")
    v.add_argument("--slot", action="append", help="only this slot (repeatable)")
    v.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    v.add_argument("--dtype", action="append", choices=sorted(DTYPE_NAMES), help="only this dtype (repeatable)")
    v.add_argument("--model", help="model profile to verify against (overrides the bundle's metadata)")
    v.add_argument("--profile", action="append", help="only this diagnostic profile (repeatable)")
    v.add_argument("--seeds", type=int, default=1, help="number of seeds per profile (default 1)")
    v.add_argument("--seed-base", type=int, default=None,
                   help="first seed (default: 0 for built-ins; drawn at random and printed for a bundle)")
    v.add_argument("--random-seeds", action="store_true",
                   help="draw the first seed at random (inputs no candidate can anticipate); it is printed")
    v.add_argument("--replays", type=int, default=3,
                   help="fresh-input replays per profile (>= 2; a bundle gets up to 2 more, drawn at random)")
    v.add_argument("--time", action="store_true", help="time candidate and incumbent side by side")
    iso = v.add_mutually_exclusive_group()
    iso.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                     help="run candidate code in a worker process (default for bundles)")
    iso.add_argument("--in-process", dest="isolate", action="store_false",
                     help="run candidate code in this process (debuggable; default for built-ins)")
    v.add_argument("--timeout", type=float, default=30.0, help="per-call deadline in seconds (worker and collective ranks)")
    v.add_argument("--world-size", type=int, action="append", help="collective world size (repeatable; default 2)")
    v.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    v.add_argument("--store", metavar="FILE", help="append receipts to this SQLite database")
    v.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    v.set_defaults(func=_cmd_verify)
    from kernelslot.engines.cli import add_parser as add_e2e_parser

    add_e2e_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kernelslot.abi import CapabilityError
    from kernelslot.bundle import ManifestError

    try:
        return args.func(args)
    except (ManifestError, UsageError, UnknownSlotError, CapabilityError) as exc:
        print(f"kernelslot: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kernelslot: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
