"""SQLite store of verification runs: runs, per-profile results, per-check rows, timings.

One ``runs`` row per ``kernelslot verify`` invocation (command, device, runner, bundle id and
hash, seeds, final status), one ``results`` row per slot × profile × dtype × seed (status,
metrics, timing, skipped reason, and the evidence the status rests on where not the device itself:
``triton-interpreter on cpu; CUDA not run``), one ``checks`` row per check the referee recorded and one
``envelopes`` row per slot × variant whose verified envelope was recorded (its JSON form,
``verify/envelope.py``; read back by :meth:`ResultStore.envelopes`). Fields a
result carries beyond the known columns (added by later referee versions) are kept in the
result's ``extra`` JSON, so the schema does not have to change with them. Each slot's rows are
written in one transaction as soon as the slot finishes, so an interrupted run keeps every slot
it completed (its status stays ``running``).

The store never creates directories and refuses a file that is not a SQLite database
(:func:`check_store_path`); an older store file gains the missing columns when opened.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a type only: the store never imports the referee
    from kernelslot.verify.verdict import SlotReport

SQLITE_MAGIC = b"SQLite format 3\x00"
COLUMNS = {
    "runs": ("id INTEGER PRIMARY KEY", "started REAL", "finished REAL", "command TEXT", "device TEXT",
             "runner TEXT", "bundle_id TEXT", "bundle_hash TEXT", "version TEXT", "seeds TEXT", "status TEXT",
             "extra TEXT"),
    "results": ("id INTEGER PRIMARY KEY", "run_id INTEGER REFERENCES runs(id)", "slot TEXT", "kernel TEXT",
                "profile TEXT", "dtype TEXT", "model TEXT", "seed INTEGER", "status TEXT", "failed_checks TEXT",
                "checks TEXT", "metrics TEXT", "timing TEXT", "skipped_reason TEXT", "extra TEXT", "evidence TEXT"),
    "checks": ("result_id INTEGER REFERENCES results(id)", "run_id INTEGER REFERENCES runs(id)", "name TEXT",
               "status TEXT", "message TEXT"),
    "slot_errors": ("run_id INTEGER REFERENCES runs(id)", "slot TEXT", "message TEXT"),
    "envelopes": ("run_id INTEGER REFERENCES runs(id)", "slot TEXT", "variant TEXT", "envelope TEXT"),
}
_KNOWN_RESULT_FIELDS = {"slot", "kernel", "profile", "dtype", "model", "seed", "checks", "metrics", "timing",
                        "skipped_reason", "status", "evidence"}


class StoreError(ValueError):
    """The store path cannot be used (one line: which path, why, what to do)."""


def check_store_path(path: str | Path, flag: str = "--store", must_exist: bool = False) -> Path:
    """Validate a store path without creating anything; raise :class:`StoreError` if unusable."""
    p = Path(path)
    if p.exists():
        if not p.is_file():
            raise StoreError(f"{flag} {p}: not a file")
        with open(p, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
        if head and head != SQLITE_MAGIC:
            raise StoreError(f"{flag} {p}: not a SQLite database (give a new file name or an existing kernelslot store)")
        if not must_exist and not os.access(p, os.W_OK):
            raise StoreError(f"{flag} {p}: not writable")
        if head:
            try:
                with sqlite3.connect(f"file:{p}?mode=ro", uri=True) as db:
                    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{flag} {p}: not a usable SQLite database ({exc})") from None
            if tables and "runs" not in tables:
                raise StoreError(f"{flag} {p}: a SQLite database but not a kernelslot store (it has no runs table)")
        return p
    if must_exist:
        raise StoreError(f"{flag} {p}: no such file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise StoreError(f"{flag} {p}: directory {parent} does not exist (create it first; the store never creates directories)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(f"{flag} {p}: directory {parent} is not writable")
    return p


class ResultStore:
    def __init__(self, path: str | Path, must_exist: bool = False):
        self.path = check_store_path(path, must_exist=must_exist)
        try:
            self.db = sqlite3.connect(self.path)
            self.db.row_factory = sqlite3.Row
            self._create_or_migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"--store {self.path}: cannot be used as a kernelslot store ({exc})") from None

    def _create_or_migrate(self) -> None:
        existing = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        with self.db:
            for table, cols in COLUMNS.items():
                if table not in existing:
                    self.db.execute(f"CREATE TABLE {table} ({', '.join(cols)})")
                    continue
                have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
                for col in cols:
                    name = col.split()[0]
                    if name not in have and "PRIMARY KEY" not in col:
                        self.db.execute(f"ALTER TABLE {table} ADD COLUMN {col.split(' REFERENCES')[0]}")

    def start_run(self, command: str, device: str, runner: str, bundle_id: str | None, bundle_hash: str | None,
                  seeds: list[int] | tuple[int, ...] = (), **extra: Any) -> int:
        """Record a run as ``running``; ``extra`` holds plain fields (e.g. a sandbox mode)."""
        from kernelslot import __version__

        with self.db:
            cur = self.db.execute(
                "INSERT INTO runs (started, command, device, runner, bundle_id, bundle_hash, version, seeds, status, extra)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                (time.time(), command, device, runner, bundle_id, bundle_hash, __version__, json.dumps(list(seeds)),
                 "running", json.dumps(extra, default=str)),
            )
        return int(cur.lastrowid)

    def add_report(self, run_id: int, report: "SlotReport") -> None:
        with self.db:  # one transaction per slot
            for r in report.results:
                d = asdict(r)
                extra = {k: v for k, v in d.items() if k not in _KNOWN_RESULT_FIELDS}
                cur = self.db.execute(
                    "INSERT INTO results (run_id, slot, kernel, profile, dtype, model, seed, status, failed_checks,"
                    " checks, metrics, timing, skipped_reason, extra, evidence) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, r.slot, r.kernel, r.profile, r.dtype, r.model, r.seed, r.status,
                     ",".join(sorted(c.name for c in r.failures())), json.dumps(d["checks"], default=str),
                     json.dumps(r.metrics, default=str), json.dumps(r.timing, default=str), r.skipped_reason,
                     json.dumps(extra, default=str), r.evidence),
                )
                self.db.executemany("INSERT INTO checks VALUES (?,?,?,?,?)",
                                    [(cur.lastrowid, run_id, c.name, c.status, c.message) for c in r.checks])
            for msg in report.errors:
                self.db.execute("INSERT INTO slot_errors VALUES (?,?,?)", (run_id, report.slot, msg))
            for variant, env in report.envelope.items():
                self.db.execute("INSERT INTO envelopes VALUES (?,?,?,?)", (run_id, report.slot, variant, json.dumps(env)))

    def finish_run(self, run_id: int, status: str) -> None:
        with self.db:
            self.db.execute("UPDATE runs SET finished = ?, status = ? WHERE id = ?", (time.time(), status, run_id))

    # --- reading -----------------------------------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        """Every run, oldest first, with its counts of results by status."""
        rows = self.db.execute(
            "SELECT runs.*, "
            " (SELECT COUNT(*) FROM results WHERE run_id = runs.id AND status = 'pass') AS passed,"
            " (SELECT COUNT(*) FROM results WHERE run_id = runs.id AND status = 'fail') AS failed,"
            " (SELECT COUNT(*) FROM results WHERE run_id = runs.id) AS total,"
            " (SELECT GROUP_CONCAT(DISTINCT slot) FROM results WHERE run_id = runs.id) AS slots"
            " FROM runs ORDER BY id").fetchall()
        return [dict(r) for r in rows]

    def run(self, run_id: int) -> dict[str, Any]:
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            known = [str(r["id"]) for r in self.db.execute("SELECT id FROM runs ORDER BY id")]
            raise StoreError(f"{self.path}: no run {run_id}; runs: {', '.join(known) or 'none'}")
        return dict(row)

    def results(self, run_id: int) -> list[dict[str, Any]]:
        """A run's results as report-like dicts (checks, metrics and timing decoded)."""
        self.run(run_id)
        out = []
        for row in self.db.execute("SELECT * FROM results WHERE run_id = ? ORDER BY rowid", (run_id,)):
            d = dict(row)
            for key in ("checks", "metrics", "timing", "extra"):
                d[key] = json.loads(d[key]) if d.get(key) else ({} if key != "checks" else [])
            d.update({k: v for k, v in d.pop("extra").items() if k not in d})
            d["evidence"] = d.get("evidence") or ""  # a row stored before the column existed rests on its device
            out.append(d)
        return out

    def slot_errors(self, run_id: int) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT slot, message FROM slot_errors WHERE run_id = ?", (run_id,))]

    def envelopes(self, run_id: int) -> dict[str, dict[str, Any]]:
        """slot -> variant -> verified envelope (as recorded: a staircase, or a run before corners
        existed recorded none) of a run."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.db.execute("SELECT slot, variant, envelope FROM envelopes WHERE run_id = ?", (run_id,)):
            out.setdefault(r["slot"], {})[r["variant"]] = json.loads(r["envelope"])
        return out

    def close(self) -> None:
        self.db.close()
