"""``kernelslot serve``, ``kernelslot submit`` and ``kernelslot leaderboard`` (docs/service.md)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_RUN = 0, 1, 2, 3
_EXIT = {"pass": EXIT_PASS, "fail": EXIT_FAIL, "invalid": EXIT_USAGE, "not run": EXIT_NOT_RUN}
_MISSING = ("the service needs its extra: pip install 'kernelslot[service]' (ray, sqlalchemy, alembic, psycopg)")


def _need_extra() -> None:
    try:
        import alembic  # noqa: F401
        import ray  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"kernelslot: error: {_MISSING} ({exc})")


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=os.environ.get("KERNELSLOT_SERVICE_STORE", "kernelslot-service.db"),
                   help="SQLite file or SQLAlchemy URL (postgresql+psycopg://...) of the service's store "
                        "(default $KERNELSLOT_SERVICE_STORE, else ./kernelslot-service.db)")


def _line(sub) -> str:
    state = sub.status if sub.done else sub.state
    return f"#{sub.id} {state}" + (f": {sub.reason}" if sub.reason else "") + f"  (bundle {sub.hash[:12]})"


def cmd_submit(args: argparse.Namespace) -> int:
    _need_extra()
    from kernelslot.service.client import Client, ServiceError

    url = args.service or (None if args.local else os.environ.get("KERNELSLOT_SERVICE"))
    if not url and not args.local:
        print("kernelslot: error: give --service URL (a `kernelslot serve`), set $KERNELSLOT_SERVICE, or --local "
              "(an embedded service for this command)", file=sys.stderr)
        return EXIT_USAGE
    missing = [b for b in args.bundle if not Path(b).exists()]
    if missing:
        print(f"kernelslot: error: {missing[0]}: no such bundle directory or archive", file=sys.stderr)
        return EXIT_USAGE
    options = {"device": args.device, "time": not args.no_time}
    try:
        client = Client(url) if url else Client(local=True, store=args.store, num_cpus=args.num_cpus,
                                                cpu_workers=args.cpu_workers)
    except ServiceError as exc:
        print(f"kernelslot: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with client:
        try:
            subs = [client.submit(b, submitter=args.submitter, **options) for b in args.bundle]
            for b, s in zip(args.bundle, subs):
                print(f"{b}: {_line(s)}", flush=True)
            if args.local or args.wait:
                by_id = {s.id: b for b, s in zip(args.bundle, subs)}
                pending = [s for s in subs if not s.done]
                for s in client.as_completed(pending, timeout=args.timeout):
                    print(f"{by_id[s.id]}: {_line(s)}", flush=True)
        except (ServiceError, TimeoutError) as exc:
            print(f"kernelslot: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    finals = [s for s in subs if s.done]
    if not finals:
        return EXIT_PASS  # acknowledged and queued
    return max(_EXIT.get(s.status, EXIT_FAIL) for s in finals)


def cmd_serve(args: argparse.Namespace) -> int:
    _need_extra()
    import logging

    from kernelslot.service.http import serve_http
    from kernelslot.service.service import Service

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    service = Service(args.store, address=args.address, max_attempts=args.max_attempts,
                      job_timeout_s=args.job_timeout, num_cpus=args.num_cpus, cpu_workers=args.cpu_workers)
    print(f"kernelslot serve: store {service.store.url}; starting Ray "
          f"{'at ' + args.address if args.address else '(local, CPU only, no dashboard)'} ...", file=sys.stderr, flush=True)
    service.start()
    server = serve_http(service, args.host, args.port)
    host, port = server.server_address[:2]
    print(f"kernelslot serve: {len(service.workers)} device worker(s); listening on http://{host}:{port} "
          "(leaderboard at /, submissions at /v1/submissions); Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("kernelslot serve: stopping (running jobs resume at the next start)", file=sys.stderr)
    finally:
        server.shutdown()
        service.stop()
    return EXIT_PASS


def cmd_leaderboard(args: argparse.Namespace) -> int:
    _need_extra()
    from kernelslot.service.leaderboard import render_leaderboard
    from kernelslot.service.store import ServiceStore

    if "://" not in args.store and not Path(args.store).is_file():
        print(f"kernelslot: error: --store {args.store}: no such store (run `kernelslot serve` or "
              "`kernelslot submit --local` first)", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.html)
    if not out.parent.is_dir():
        print(f"kernelslot: error: --html {out}: directory {out.parent} does not exist", file=sys.stderr)
        return EXIT_USAGE
    store = ServiceStore(args.store)
    try:
        reports = out.with_name(out.stem + "-reports")
        reported = store.reported()
        if reported:
            reports.mkdir(exist_ok=True)
            for sid in sorted(reported):
                (reports / f"{sid}.html").write_text(store.verdict(sid)["report_html"])
        out.write_text(render_leaderboard(store, report_link=lambda sid: f"{reports.name}/{sid}.html"))
    finally:
        store.close()
    print(f"wrote {out} ({len(reported)} report(s) in {reports}/)")
    return EXIT_PASS


def add_parser(sub) -> None:
    s = sub.add_parser("submit", help="submit bundles to an admission service and print their verdicts")
    s.add_argument("bundle", nargs="+", help="bundle directories or archives (tar, tar.gz, zip)")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--service", metavar="URL", help="a `kernelslot serve` (default $KERNELSLOT_SERVICE)")
    where.add_argument("--local", action="store_true",
                       help="run an embedded service (local Ray, the --store file) for this command and wait")
    s.add_argument("--wait", action="store_true", help="with --service: wait for the verdicts (default: acknowledged)")
    s.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    s.add_argument("--submitter", default=os.environ.get("USER"), help="credited name (default $USER)")
    s.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    s.add_argument("--no-time", action="store_true", help="verify without timing against the incumbent")
    s.add_argument("--num-cpus", type=int, default=None, help="with --local: CPUs Ray may use (default: all)")
    s.add_argument("--cpu-workers", type=int, default=1, help="with --local: workers sharing the CPU (default 1)")
    _store_arg(s)
    s.set_defaults(func=cmd_submit)
    v = sub.add_parser("serve", help="run the admission service: Ray device workers, the store, HTTP and the leaderboard")
    v.add_argument("--address", help="join this Ray cluster (default: start a local instance)")
    v.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1; no authentication)")
    v.add_argument("--port", type=int, default=8470, help="HTTP port (default 8470; 0: any free one)")
    v.add_argument("--max-attempts", type=int, default=3, help="attempts per job before `not run: worker lost`")
    v.add_argument("--job-timeout", type=float, default=3600.0, help="seconds a job may run before it is retried")
    v.add_argument("--num-cpus", type=int, default=None, help="CPUs the local Ray instance may use (default: all)")
    v.add_argument("--cpu-workers", type=int, default=1,
                   help="workers sharing each node's CPU (default 1: the CPU is one device; more run jobs side by "
                        "side, under each other's load)")
    _store_arg(v)
    v.set_defaults(func=cmd_serve)
    b = sub.add_parser("leaderboard", help="write the service's leaderboard as one HTML page")
    b.add_argument("--html", required=True, metavar="FILE", help="the page to write (reports go to FILE's stem-reports/)")
    _store_arg(b)
    b.set_defaults(func=cmd_leaderboard)
