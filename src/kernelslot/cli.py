"""The ``kernelslot`` command (also ``python -m kernelslot``).

``kernelslot slots [NAME]``      the catalog; with NAME, that slot's full contract
``kernelslot scan BUNDLE``       manifest and static checks only (no candidate code runs)
``kernelslot verify [BUNDLE]``   the referee; with no bundle, the built-in kernels of every slot
``kernelslot new SLOT DIR``      write a bundle for SLOT that passes ``verify`` as written
``kernelslot report ...``        an HTML page from a JSON report or a store; list / compare stored runs
``kernelslot e2e [BUNDLE] --model M``  end-to-end qualification inside a transformers model (engines/cli.py)

Exit status: 0 everything that ran passed, 1 a verification failed, 2 bad input (one line on
stderr, never a traceback), 3 nothing could run here (not run: no CUDA device, a missing package,
a cuda.cubin.v1 artifact without CUDA). With several slots the worst real verdict decides and the
slots not run are listed. Every output path is validated before anything runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from typing import Any

from kernelslot import __version__

# torch and the catalog are imported where needed, so `kernelslot --version` and `--help` are instant
DTYPE_NAMES = ("bfloat16", "float16", "float32")
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_RUN = 0, 1, 2, 3


class UsageError(Exception):
    """Bad command-line input: reported on one line, exit status 2."""


def check_output_path(flag: str, path: str) -> Path:
    """An output file we will write later: its directory exists and it can be written now."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"{flag} {p}: is a directory; give a file name")
    if not parent.is_dir():
        raise UsageError(f"{flag} {p}: directory {parent} does not exist (create it first)")
    try:
        if p.exists():
            with open(p, "a", encoding="utf-8"):
                pass
        else:
            probe = parent / f".{p.name}.kernelslot-probe-{os.getpid()}"
            probe.touch()
            probe.unlink()
    except OSError as exc:
        raise UsageError(f"{flag} {p}: cannot be written ({exc.strerror or exc})") from None
    return p


def _command_line() -> str:
    return " ".join(["kernelslot", *sys.argv[1:]])


def write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory, so a failed write never leaves half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _console(file=None):
    from rich.console import Console

    return Console(file=file or sys.stdout, highlight=False, soft_wrap=True)


def _print_verdicts(text: str, console) -> None:
    """Print a verdict table: coloured on a terminal, plain when piped (or with NO_COLOR)."""
    from rich.text import Text

    t = Text(text)
    t.highlight_regex(r"\b(FAIL|fail)\b|^  ! .*$", "bold red")
    t.highlight_regex(r"\b(ok|PASS)\b", "green")
    console.print(t)


# --- slots, new -------------------------------------------------------------------------------

def _cmd_slots(args: argparse.Namespace) -> int:
    from kernelslot.slots import get_slot
    from kernelslot.slots.contract import catalog_summary, families, family_page, render_contract, slot_contract

    if args.docs:
        out = Path(args.docs)
        if not out.is_dir():
            raise UsageError(f"--docs {out}: not a directory (create it first)")
        for fam in families():
            write_text(out / f"{fam}.md", family_page(fam))
            print(f"wrote {out / f'{fam}.md'}")
        return EXIT_PASS
    if args.oracle:
        return _oracle(args)
    if args.name:
        contract = slot_contract(get_slot(args.name))
        print(json.dumps(contract, indent=2) if args.json else render_contract(contract))
        return EXIT_PASS
    rows = catalog_summary()
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_PASS
    for r in rows:
        print(f"{r['slot']}  ({r['kind']})")
        print(f"    {r['signature']}")
        if r["summary"]:
            print(f"    {r['summary']}")
        print(f"    comparator: {r['comparator']}")
        print(f"    {r['profiles']} profiles; dtypes {', '.join(r['dtypes'])}; models {', '.join(r['models'])}")
    print("\n`kernelslot slots NAME` shows one slot's full contract; `kernelslot new NAME DIR` writes a bundle for it.")
    return EXIT_PASS


def _oracle(args: argparse.Namespace) -> int:
    """``slots [NAME] --oracle``: the oracle self-test's margins (exit 1 when a profile accepts a wrong answer)."""
    from kernelslot.slots import CATALOG, get_slot
    from kernelslot.verify.oracle import oracle_json, oracle_slot, render_oracle, render_summary

    defns = [get_slot(args.name)] if args.name else [CATALOG[n] for n in sorted(CATALOG)]
    runs = [(d, oracle_slot(d, seed=args.seed)) for d in defns]
    if args.json:
        print(json.dumps([oracle_json(d, r) for d, r in runs], indent=2))
    elif args.name:
        print(render_oracle(runs[0][0], runs[0][1], verbose=True))
    else:  # the whole catalog: one line per slot (the table of docs/referee.md, "Oracle margins")
        print(render_summary(runs))
    return EXIT_FAIL if any(p.accepted for _, r in runs for p in r) else EXIT_PASS


def _cmd_new(args: argparse.Namespace) -> int:
    from kernelslot.bundle.template import TemplateError, write_bundle

    try:
        written = write_bundle(args.slot, Path(args.dir), model=args.model, force=args.force)
    except TemplateError as exc:
        raise UsageError(str(exc)) from None
    for p in written:
        print(f"wrote {p}")
    print(f"next: kernelslot scan {args.dir} && kernelslot verify {args.dir}")
    return EXIT_PASS


# --- scan, verify -----------------------------------------------------------------------------

def _cmd_scan(args: argparse.Namespace) -> int:
    from kernelslot.bundle import load_bundle

    bundle = load_bundle(args.bundle)
    m = bundle.manifest
    print(f"bundle {m.bundle_id}  abi {m.abi_version}  sha256 {bundle.content_hash}")
    if m.competition:
        print("competition: " + ", ".join(f"{k}={v}" for k, v in m.competition.items()))
    for row in m.ops:
        origin = f"direct {row.direct.provider}" if row.direct is not None else f"{row.source}:{row.entry}"
        override = f" (override {row.base_kernel}.{row.override_point})" if row.base_kernel else ""
        print(f"  {row.label:40s} {origin}{override}  model={row.model}{' graph_safe' if row.graph_safe else ''}")
        print(f"    effective domain: {row.domain.describe()}")
        if row.base_kernel and row.architectures:
            print(f"    architectures {', '.join(row.architectures)} bind the device entry only; the composed torch form runs anywhere")
        if row.index in bundle.unbuilt:
            print(f"    not built here: {bundle.unbuilt[row.index]}")
        elif row.direct is not None:  # bindings, declared vs observed inventory, seal (docs/direct-artifacts.md)
            from kernelslot.bundle.direct import describe_seal

            print("\n".join(describe_seal(row.direct, bundle.seals[row.index])))
    print(f"OK: {len(m.ops)} op row(s), static checks passed")
    return EXIT_PASS


def _options(args: argparse.Namespace, targets: list[tuple[str, list[Any]]]):
    import torch

    from kernelslot.slots import get_slot
    from kernelslot.verify import VerifyOptions

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False)")
    dtypes = tuple(getattr(torch, d) for d in args.dtype) if args.dtype else None
    if args.profile:
        valid = sorted({p.name for name, _ in targets for p in get_slot(name).profiles})
        unknown = [p for p in args.profile if p not in valid]
        if unknown:
            raise UsageError(f"--profile {unknown[0]}: no such profile in {', '.join(n for n, _ in targets)}; "
                             f"valid: {', '.join(valid)}")
    if args.replays < 2:
        raise UsageError("--replays must be at least 2 (fresh-input replay catches cached results)")
    if any(w < 2 for w in args.world_size or []):
        raise UsageError("--world-size must be at least 2 (collective slots run one process per rank)")
    if args.seeds < 1:
        raise UsageError(f"--seeds must be at least 1, got {args.seeds}")
    if args.draws < 0:
        raise UsageError(f"--draws must be >= 0 (0: no drawn profiles), got {args.draws}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    if args.envelope_mib <= 0:
        raise UsageError(f"--envelope-mib must be a positive number of MiB, got {args.envelope_mib}")
    from kernelslot.verify.envelope import SIZE_FIELDS
    from kernelslot.verify.options import UNTRUSTED

    for f in args.envelope_field or ():
        if f not in SIZE_FIELDS:
            raise UsageError(f"--envelope-field {f}: not a size field; valid: {', '.join(SIZE_FIELDS)}")
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
                         collective_timeout_s=args.timeout, envelope_max_bytes=args.envelope_mib << 20,
                         **(UNTRUSTED if untrusted else {}),
                         envelope_fields=tuple(args.envelope_field) if args.envelope_field else None, draws=args.draws)


def _targets(args: argparse.Namespace) -> tuple[list[tuple[str, list[Any]]], object | None]:
    from kernelslot.slots import CATALOG, get_slot
    from kernelslot.slots.models import MODELS, resolve_model

    if args.model:  # the arena's spellings too (MiniMax-M3-NVFP4, __none__)
        resolved = resolve_model(args.model)
        if resolved is None:
            raise UsageError(f"--model {args.model!r} is unknown; known: {', '.join(MODELS)}")
        args.model = resolved[0]

    if args.bundle:
        from kernelslot.bundle import load_bundle

        bundle = load_bundle(args.bundle)
        cands = bundle.candidates(model=args.model, device=args.device)  # --model rebinds every row
        for s in args.slot or []:
            if s not in cands:
                raise UsageError(f"--slot {s}: the bundle has no op for it; valid: {', '.join(sorted(cands))}")
        return [(s, c) for s, c in cands.items() if not args.slot or s in args.slot], bundle
    names = args.slot or sorted(CATALOG)
    for n in names:
        if n not in CATALOG:
            raise UsageError(f"--slot {n}: unknown slot; valid: {', '.join(sorted(CATALOG))}")
    return [(n, list(get_slot(n).builtin_candidates())) for n in names], None


def _make_runner(args: argparse.Namespace, bundle: object | None):
    """Bundles run isolated in a worker process by default; built-in kernels are trusted code."""
    from kernelslot.isolation import make_runner

    from kernelslot.isolation.sandbox import SandboxUnavailable

    isolate = args.isolate if args.isolate is not None else (bundle is not None or args.require_sandbox)
    if args.require_sandbox and not isolate:
        raise UsageError("--require-sandbox and --in-process contradict each other: in-process candidate code is not sandboxed")
    if args.memory_limit < 0:
        raise UsageError(f"--memory-limit must be >= 0 GiB (0: no cap), got {args.memory_limit}")
    if args.sandbox:  # every sandbox consumer of this run reads it: collective rank processes too
        os.environ["KERNELSLOT_SANDBOX"] = args.sandbox
    try:
        return make_runner(isolate, args.timeout, device=args.device, memory_limit_gib=args.memory_limit or None,
                           sandbox=args.sandbox, require_sandbox=args.require_sandbox)
    except SandboxUnavailable as exc:
        raise UsageError(str(exc)) from None


def _cmd_verify(args: argparse.Namespace) -> int:
    from kernelslot.report.payload import build_payload, slot_dict
    from kernelslot.report.progress import VerifyProgress
    from kernelslot.slots import get_slot
    from kernelslot.verify import verify_slot
    from kernelslot.verify.verdict import run_evidence, verdict_text
    from kernelslot.report.table import render_slot

    json_path = check_output_path("--json", args.json) if args.json else None
    html_path = check_output_path("--html", args.html) if args.html else None
    if args.store:
        from kernelslot.store.results import check_store_path

        check_store_path(check_output_path("--store", args.store))
    targets, bundle = _targets(args)  # a bad bundle is reported before anything runs; rows this machine
    # cannot build or run carry the reason (Needs.blocked): their slots are "not run", the others run
    opts = _options(args, targets)
    runner = _make_runner(args, bundle)
    from kernelslot.verify.integrity import run_provenance

    receipt = run_provenance(runner)
    if not args.quiet:
        print(f"sandbox: {receipt['sandbox_detail']}; memory: {receipt['memory_cap']}; "
              f"referee sha256 {str(receipt['referee_sha256'])[:16]}", file=sys.stderr)
    store = run_id = None
    if args.store:
        from kernelslot.store import ResultStore

        store = ResultStore(args.store)
        run_id = store.start_run(_command_line(), args.device, runner.name, getattr(bundle, "bundle_id", None),
                                 getattr(bundle, "content_hash", None), seeds=opts.seeds, **receipt)
    reports, slots = [], []
    sessions: dict | None = {} if bundle is None else None  # built-ins are trusted: one rank group per size for all
    started = time.perf_counter()
    console = _console()
    progress = VerifyProgress(targets, opts, quiet=args.quiet)
    complete = False
    try:
        with progress:
            for slot_name, cands in targets:
                defn = get_slot(slot_name)
                progress.start_slot(slot_name)
                report = verify_slot(defn, cands, opts, runner=runner, progress=progress.profile_done, sessions=sessions)
                reports.append(report)
                slots.append(slot_dict(report, defn.describe_comparator()))
                if store:
                    store.add_report(run_id, report)
                progress.pause_for_output()
                _print_verdicts(render_slot(report, defn.describe_comparator()) + "\n", console)
        complete = True
    finally:
        runner.close()
        for session in (sessions or {}).values():
            session.close()
        elapsed = time.perf_counter() - started
        failed = [r.slot for r in reports if r.status == "fail"]
        not_run = [r for r in reports if r.status == "not run"]
        passed = complete and not failed and len(not_run) < len(reports)
        verdict = ("pass" if passed else "fail" if failed or not reports else "not run") if complete else "interrupted"
        # what the verdicts rest on where not the device itself (verify/interpreted.py): said with every verdict
        evidence = run_evidence([(r.slot, r.evidence) for r in reports if r.status != "not run"])
        receipt = {**receipt, **run_provenance(runner)}  # the native library may have been loaded meanwhile
        if store:
            store.finish_run(run_id, verdict)
            store.close()
        if json_path or html_path:  # written even for an interrupted run: every completed slot is kept
            payload = build_payload(slots, passed=passed, elapsed_s=elapsed, device=args.device, runner=runner.name,
                                    seeds=list(opts.seeds), command=_command_line(), timed=args.time,
                                    bundle={"id": bundle.bundle_id, "sha256": bundle.content_hash} if bundle else None,
                                    **receipt)
            payload["status"] = verdict
            payload["evidence"], payload["verdict"] = evidence, verdict_text(verdict, evidence)
            if json_path:
                write_text(json_path, json.dumps(payload, indent=2, default=str))
            if html_path:
                from kernelslot.report.html import render_html

                write_text(html_path, render_html(payload))
    ran = len(reports) - len(not_run)
    status = EXIT_FAIL if failed else EXIT_PASS if ran else EXIT_NOT_RUN
    summary = f"{ran - len(failed)}/{ran} slots passed in {elapsed:.1f}s"
    head = {EXIT_PASS: "PASS", EXIT_FAIL: "FAIL", EXIT_NOT_RUN: "NOT RUN"}[status]
    _print_verdicts(head + (f" ({evidence})" if evidence and status != EXIT_NOT_RUN else "") + ": " + summary
                    + (f"; failed: {', '.join(failed)}" if failed else "")
                    + (f"; not run: {'; '.join(f'{r.slot} ({r.not_run})' for r in not_run)}" if not_run else ""), console)
    return status


# --- report -----------------------------------------------------------------------------------

def _cmd_report(args: argparse.Namespace) -> int:
    from kernelslot.report import compare
    from kernelslot.report.payload import load_payload, payload_from_store

    out = check_output_path("-o", args.output) if args.output else None
    if args.source and args.store:
        raise UsageError("give either a report (RESULT.json or STORE) or --store FILE, not both")
    source = args.source or args.store
    if source is None:
        raise UsageError("nothing to report: give RESULT.json, a store file, or --store FILE")
    from kernelslot.store.results import SQLITE_MAGIC, ResultStore

    is_store = Path(source).is_file() and Path(source).read_bytes()[:len(SQLITE_MAGIC)] == SQLITE_MAGIC
    if args.compare and not is_store:
        raise UsageError(f"--compare needs a store; {source} is not a SQLite store")
    if not is_store:
        if args.run is not None:
            raise UsageError(f"--run needs a store; {source} is a JSON report")
        payload = load_payload(source)
    else:
        store = ResultStore(source, must_exist=True)
        try:
            if args.compare:
                print(compare.render_comparison(compare.compare_runs(store, *args.compare)))
                return EXIT_PASS
            runs = store.runs()
            if out is None:
                print(compare.render_runs(runs))
                return EXIT_PASS
            if not runs:
                raise UsageError(f"{source}: the store holds no runs")
            payload = payload_from_store(store, args.run if args.run is not None else runs[-1]["id"])
        finally:
            store.close()
    if out is None:
        raise UsageError("-o FILE is required to write the HTML page of a JSON report")
    from kernelslot.report.html import render_html

    write_text(out, render_html(payload))
    print(f"wrote {out}")
    return EXIT_PASS


# --- parser -----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelslot", description="Verify kernels against inference-engine slot contracts.")
    p.add_argument("--version", action="version", version=f"kernelslot {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("slots", help="list the slot catalog, or show one slot's full contract")
    s.add_argument("name", nargs="?", help="a slot name (e.g. moe.fused_experts): its full contract")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--docs", metavar="DIR", help="write one Markdown page per slot family into DIR (docs/slots)")
    s.add_argument("--oracle", action="store_true",
                   help="the oracle self-test: margins of trivially wrong answers against each profile's comparator "
                        "(NAME: per profile and answer; without NAME: the smallest per slot; exit 1 if any is accepted)")
    s.add_argument("--seed", type=int, default=0, help="with --oracle: the seed of the profiles' cases (default 0)")
    s.set_defaults(func=_cmd_slots)
    s = sub.add_parser("scan", help="check a bundle's manifest and sources without running them")
    s.add_argument("bundle")
    s.set_defaults(func=_cmd_scan)
    n = sub.add_parser("new", help="write a bundle for a slot that passes `verify` as written")
    n.add_argument("slot", help="slot name (see `kernelslot slots`)")
    n.add_argument("dir", help="directory to create (must not exist, or be empty)")
    n.add_argument("--model", help="model profile the bundle targets (default: the slot's generic one)")
    n.add_argument("--force", action="store_true", help="overwrite the template's files in an existing directory")
    n.set_defaults(func=_cmd_new)
    v = sub.add_parser("verify", help="verify a bundle (or, with none, the built-in kernels)")
    v.add_argument("bundle", nargs="?", help="bundle directory (holding manifest.toml); default: built-in kernels")
    v.add_argument("--slot", action="append", help="only this slot (repeatable)")
    v.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    v.add_argument("--dtype", action="append", choices=DTYPE_NAMES, help="only this dtype (repeatable)")
    v.add_argument("--model", help="model profile to verify against (overrides the bundle's metadata)")
    v.add_argument("--profile", action="append", help="only this diagnostic profile (repeatable)")
    v.add_argument("--seeds", type=int, default=1, help="number of seeds per profile (default 1)")
    v.add_argument("--seed-base", type=int, default=None,
                   help="first seed (default: 0 for built-ins; drawn at random and printed for a bundle)")
    v.add_argument("--draws", type=int, default=2,
                   help="drawn profiles per slot and seed: extra shapes and structures inside the slot's domain, "
                        "from Hypothesis, logged with their seed (default 2; 0: none)")
    v.add_argument("--random-seeds", action="store_true",
                   help="draw the first seed at random (inputs no candidate can anticipate); it is printed")
    v.add_argument("--replays", type=int, default=3,
                   help="base fresh-input replays per profile (>= 2); a geometric number more is drawn at random "
                        "(mean 0.25, a bundle's 2)")
    v.add_argument("--time", action="store_true", help="time candidate and incumbent side by side")
    v.add_argument("--envelope-mib", type=int, default=256, metavar="MIB",
                   help="a bundle's boundary profiles (verified envelope) are clipped to cases of at most this "
                        "many MiB (default 256)")
    v.add_argument("--envelope-field", action="append", metavar="FIELD",
                   help="extend the verified envelope only along this size field (repeatable; default: every "
                        "field the slot maps); the others are verified as observed on the profiles")
    iso = v.add_mutually_exclusive_group()
    iso.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                     help="run candidate code in a worker process (default for bundles)")
    iso.add_argument("--in-process", dest="isolate", action="store_false",
                     help="run candidate code in this process (debuggable; default for built-ins)")
    v.add_argument("--timeout", type=float, default=30.0, help="per-call deadline in seconds (worker and collective ranks)")
    v.add_argument("--sandbox", choices=("auto", "bwrap", "unshare", "none"), default=None,
                   help="sandbox for candidate code (default auto: bubblewrap, else unshare, else none with a warning; "
                        "or $KERNELSLOT_SANDBOX)")
    v.add_argument("--require-sandbox", action="store_true",
                   help="refuse to run candidate code without a sandbox (exit 2) instead of warning")
    v.add_argument("--memory-limit", type=float, default=4.0, metavar="GIB",
                   help="resident-memory cap per worker, in GiB (default 4; 0: no cap); untouched reservations do not count")
    v.add_argument("--world-size", type=int, action="append", help="collective world size (repeatable; default 2)")
    v.add_argument("--json", metavar="FILE", help="write the full report as JSON (docs/report-schema.md)")
    v.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML page")
    v.add_argument("--store", metavar="FILE", help="append receipts to this SQLite database (its directory must exist)")
    v.add_argument("--quiet", action="store_true", help="no progress on stderr")
    v.set_defaults(func=_cmd_verify)
    r = sub.add_parser("report", help="HTML page of an earlier run; list or compare the runs in a store")
    r.add_argument("source", nargs="?", help="a --json report or a --store database")
    r.add_argument("-o", "--output", metavar="FILE", help="write the HTML page here")
    r.add_argument("--store", metavar="FILE", help="the store to list (no -o) or to read runs from")
    r.add_argument("--run", type=int, help="the stored run to render (default: the latest)")
    r.add_argument("--compare", type=int, nargs=2, metavar=("A", "B"),
                   help="compare stored runs A and B: changed checks, timings moved beyond their spread")
    r.set_defaults(func=_cmd_report)
    from kernelslot.engines.cli import add_parser as add_e2e_parser

    add_e2e_parser(sub)
    from kernelslot.service.cli import add_parser as add_service_parsers

    add_service_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--version"]:  # answered before the parser imports the subcommands' dependencies (torch)
        print(f"kernelslot {__version__}")
        return EXIT_PASS
    args = build_parser().parse_args(argv)
    from kernelslot.abi import CapabilityError
    from kernelslot.bundle import ManifestError
    from kernelslot.report import ReportError
    from kernelslot.slots import UnknownSlotError
    from kernelslot.store.results import StoreError

    try:
        return args.func(args)
    except (ManifestError, UsageError, UnknownSlotError, CapabilityError, StoreError, ReportError) as exc:
        print(f"kernelslot: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kernelslot: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
