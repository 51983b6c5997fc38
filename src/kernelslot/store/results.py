"""SQLite store of verification runs and per-profile receipts.

One ``runs`` row per ``kernelslot verify`` invocation and one ``results`` row per slot ×
profile × dtype × seed. Each slot's rows are written in one transaction as soon as the slot
finishes, so an interrupted run keeps every slot it completed.
"""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from kernelslot.verify.report import SlotReport

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY, started REAL, command TEXT, device TEXT, runner TEXT,
  bundle_id TEXT, bundle_hash TEXT, version TEXT
);
CREATE TABLE IF NOT EXISTS results (
  run_id INTEGER REFERENCES runs(id), slot TEXT, kernel TEXT, profile TEXT, dtype TEXT, model TEXT,
  seed INTEGER, status TEXT, failed_checks TEXT, checks TEXT, metrics TEXT, timing TEXT
);
CREATE TABLE IF NOT EXISTS slot_errors (run_id INTEGER REFERENCES runs(id), slot TEXT, message TEXT);
"""


class ResultStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path)
        self.db.executescript(SCHEMA)

    def start_run(self, command: str, device: str, runner: str, bundle_id: str | None, bundle_hash: str | None) -> int:
        from kernelslot import __version__

        with self.db:
            cur = self.db.execute(
                "INSERT INTO runs (started, command, device, runner, bundle_id, bundle_hash, version) VALUES (?,?,?,?,?,?,?)",
                (time.time(), command, device, runner, bundle_id, bundle_hash, __version__),
            )
        return int(cur.lastrowid)

    def add_report(self, run_id: int, report: SlotReport) -> None:
        with self.db:  # one transaction per slot
            for r in report.results:
                self.db.execute(
                    "INSERT INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, r.slot, r.kernel, r.profile, r.dtype, r.model, r.seed, r.status,
                     ",".join(sorted(c.name for c in r.failures())),
                     json.dumps([c.__dict__ for c in r.checks]), json.dumps(r.metrics), json.dumps(r.timing)),
                )
            for msg in report.errors:
                self.db.execute("INSERT INTO slot_errors VALUES (?,?,?)", (run_id, report.slot, msg))

    def close(self) -> None:
        self.db.close()
