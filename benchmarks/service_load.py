"""Load and fault benchmark of the admission service (issue 29 part 6): a local Ray, N workers.

Submits a mix (honest and broken bundles made unique by a comment line, malformed bytes, and
byte-identical copies of earlier ones), then checks that every submission got exactly one final
answer, that no copy ran, and states the figures: submissions per minute, the admission latency of
each kind (median and p99; a copy is answered without a run), jobs per minute. With ``--kill K``
it kills a worker's process K times while jobs run (each job retried, nothing lost or doubled);
with ``--restart`` it stops the service mid-queue and starts a new one on the same store.

    python benchmarks/service_load.py --submissions 200 --workers 2 --kill 1 --restart

Jobs are quick ones (one dtype, no drawn profiles, one profile, no timing: --job-options) so the
run measures the service, not the referee. Figures are noisy on a shared machine.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
QUICK = {"dtype": ["float32"], "draws": 0, "time": False}
JOB = {"honest": {**QUICK, "profile": ["gemma_one_plus_w"]},  # honest_norm serves MiniMax-M3 only
       "broken": {**QUICK, "profile": ["single_token"]}, "malformed": QUICK}


def _variant(example: str, n: int, dest: Path) -> Path:
    """A copy of ``example`` whose kernel file gains a comment: same behaviour, a new content hash."""
    d = dest / f"{example}-{n}"
    shutil.copytree(EXAMPLES / example, d, ignore=shutil.ignore_patterns("__pycache__"))
    src = next(p for p in sorted(d.glob("*.py")))
    src.write_text(src.read_text() + f"\n# variant {n}\n")
    return d


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--submissions", type=int, default=200)
    ap.add_argument("--copies", type=float, default=0.5, help="share of byte-identical copies (default 0.5)")
    ap.add_argument("--malformed", type=float, default=0.15, help="share of malformed submissions (default 0.15)")
    ap.add_argument("--broken", type=float, default=0.4, help="share of broken among the bundles run (default 0.4)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--kill", type=int, default=0, help="kill a worker this many times while jobs run")
    ap.add_argument("--restart", action="store_true", help="stop and restart the service once mid-queue")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    from kernelslot.service.archive import pack
    from kernelslot.service.service import Service

    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="kernelslot-load-"))
    n_copies = int(args.submissions * args.copies)
    n_malformed = int(args.submissions * args.malformed)
    n_bundles = args.submissions - n_copies - n_malformed
    n_broken = int(n_bundles * args.broken)
    originals = ([("honest", pack(_variant("honest_norm", i, tmp))) for i in range(n_bundles - n_broken)]
                 + [("broken", pack(_variant("broken_partial_write", i, tmp))) for i in range(n_broken)])
    malformed = [("malformed", os.urandom(rng.randrange(10, 2000))) for _ in range(n_malformed)]
    plan = originals + malformed
    rng.shuffle(plan)
    for _ in range(n_copies):  # a copy follows its original somewhere later in the stream
        i = rng.randrange(len(plan))
        kind, data, *of = plan[i]
        kind = of[0] if of else kind
        if kind == "malformed":
            kind, data = next((k, d) for k, d, *_ in plan if k != "malformed")
        plan.insert(rng.randrange(i + 1, len(plan) + 1), ("copy", data, kind))

    store = tmp / "service.db"
    svc = Service(store, num_cpus=os.cpu_count(), cpu_workers=args.workers, max_attempts=3).start()
    print(f"{len(plan)} submissions: {len(originals)} bundles ({n_broken} broken), {n_malformed} malformed, "
          f"{n_copies} copies; {args.workers} workers", file=sys.stderr)
    latency: dict[str, list[float]] = collections.defaultdict(list)
    ids: list[tuple[int, str]] = []
    started = time.perf_counter()
    killed: list[int] = []

    def killer() -> None:
        done = 0
        while done < args.kill and not svc._stop.is_set():
            time.sleep(3.0)  # into the job
            running = [a for a in svc.store.attempts() if a["outcome"] == "running"]
            if not running:
                continue
            pid = int(running[0]["worker"].rsplit(":", 1)[1])
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it finished, or was replaced, meanwhile
                continue
            done += 1
            killed.append(running[0]["submission_id"])
            print(f"killed worker {pid} running submission {running[0]['submission_id']}", file=sys.stderr)
            time.sleep(10.0)

    if args.kill:
        threading.Thread(target=killer, daemon=True).start()
    for kind, data, *of in plan:
        t = time.perf_counter()
        row = svc.admit(data, submitter=kind, options=JOB[of[0] if of else kind])
        latency[kind].append(time.perf_counter() - t)
        ids.append((row["id"], kind))
    admitted_s = time.perf_counter() - started
    restarted = False
    while True:
        states = collections.Counter(svc.store.submission(i)["state"] for i, _ in ids)
        if states["done"] == len(ids):
            break
        if args.restart and not restarted and states["done"] > len(ids) // 2:
            print("stopping the service mid-queue and starting a new one on the same store", file=sys.stderr)
            svc.stop()
            svc = Service(store, num_cpus=os.cpu_count(), cpu_workers=args.workers, max_attempts=3).start()
            restarted = True
        time.sleep(1.0)
    elapsed = time.perf_counter() - started
    rows = {i: svc.store.submission(i) for i, _ in ids}
    attempts = svc.store.attempts()
    runs = collections.Counter(a["submission_id"] for a in attempts if a["outcome"] == "done")
    verdicts = sum(1 for i, _ in ids if svc.store.verdict(i) is not None)
    svc.stop()

    problems = []
    for i, kind in ids:
        r = rows[i]
        expect = {"honest": "pass", "broken": "fail", "malformed": "invalid"}.get(kind)
        if expect and r["status"] != expect:
            problems.append(f"#{i} {kind}: {r['status']} ({r['reason']})")
        if kind == "copy" and not (r["relation"] in ("copy", "duplicate") and runs[i] == 0):
            problems.append(f"#{i} copy ran or was not linked: {r}")
        if runs[i] > 1:
            problems.append(f"#{i} recorded {runs[i]} times")
    outcomes = collections.Counter(a["outcome"] for a in attempts)
    result = {
        "submissions": len(ids), "answered": sum(r["state"] == "done" for r in rows.values()),
        "jobs_run": sum(runs.values()), "verdicts": verdicts, "attempt_outcomes": dict(outcomes),
        "killed_during": killed, "restarted": restarted, "problems": problems,
        "wall_s": round(elapsed, 1), "admission_s": round(admitted_s, 2),
        "submissions_per_min": round(len(ids) / elapsed * 60, 1),
        "jobs_per_min": round(sum(runs.values()) / elapsed * 60, 2),
        "admission_latency_ms": {k: {"median": round(statistics.median(v) * 1e3, 2), "p99": round(_pct(v, 0.99) * 1e3, 2),
                                     "n": len(v)} for k, v in latency.items()},
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
