"""Stored verify receipts, as the engines read them (read-only; no referee code).

A slot of a bundle counts as verified when some ``verify`` run recorded for the bundle's
content hash has results for that slot, every non-skipped result passed, the run logged no
error for the slot, and (when a dtype is asked for) a passing result ran in that dtype.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Optional

__all__ = ["passing_slots"]


def passing_slots(store: str | Path, content_hash: str, dtype: Optional[str] = None) -> set[str]:
    """Slots of the bundle with ``content_hash`` holding a passing receipt in ``store``
    (covering ``dtype``, a torch dtype name, when given)."""
    if not Path(store).exists():
        return set()
    db = sqlite3.connect(f"file:{Path(store)}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT r.run_id, r.slot, r.status, r.dtype FROM results r JOIN runs u ON u.id = r.run_id "
            "WHERE u.bundle_hash = ?",
            (content_hash,)).fetchall()
        errors = set(db.execute(
            "SELECT e.run_id, e.slot FROM slot_errors e JOIN runs u ON u.id = e.run_id WHERE u.bundle_hash = ?",
            (content_hash,)).fetchall())
    except sqlite3.DatabaseError:
        return set()
    finally:
        db.close()
    by_run: dict[tuple[int, str], list[tuple[str, str]]] = {}
    for run_id, slot, status, dt in rows:
        by_run.setdefault((run_id, slot), []).append((status, dt))
    return {slot for (run_id, slot), st in by_run.items()
            if (run_id, slot) not in errors and all(s != "fail" for s, _ in st)
            and any(s == "pass" and (dtype is None or d == dtype) for s, d in st)}
