"""Stored verify receipts, as the engines read them (read-only; no referee code).

A slot of a bundle counts as verified when some ``verify`` run recorded for the bundle's
content hash has results for that slot, every non-skipped result passed, the run logged no
error for the slot, and (when a dtype is asked for) a passing result ran in that dtype. Results
resting on other evidence than the device (``evidence``: Triton's interpreter on a CPU, CUDA not
run; verify/interpreted.py) never count: an engine runs the compiled kernel.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Optional

__all__ = ["passing_slots", "verified_envelopes"]


def _passing_runs(store: str | Path, content_hash: str, dtype: Optional[str]) -> dict[str, list[int]]:
    """slot -> the ids of the runs holding a passing receipt for it (oldest first)."""
    if not Path(store).exists():
        return {}
    db = sqlite3.connect(f"file:{Path(store)}?mode=ro", uri=True)
    try:
        evidence = "r.evidence" if any(c[1] == "evidence" for c in db.execute("PRAGMA table_info(results)")) else "''"
        rows = db.execute(  # an older store has no evidence column: its results rest on their device
            f"SELECT r.run_id, r.slot, r.status, r.dtype, COALESCE({evidence}, '') FROM results r "
            "JOIN runs u ON u.id = r.run_id WHERE u.bundle_hash = ?",
            (content_hash,)).fetchall()
        errors = set(db.execute(
            "SELECT e.run_id, e.slot FROM slot_errors e JOIN runs u ON u.id = e.run_id WHERE u.bundle_hash = ?",
            (content_hash,)).fetchall())
    except sqlite3.DatabaseError:
        return {}
    finally:
        db.close()
    by_run: dict[tuple[int, str], list[tuple[str, str, str]]] = {}
    for run_id, slot, status, dt, ev in rows:
        by_run.setdefault((run_id, slot), []).append((status, dt, ev))
    out: dict[str, list[int]] = {}
    for (run_id, slot), st in sorted(by_run.items()):
        if ((run_id, slot) not in errors and all(s != "fail" for s, _, _ in st)
                and any(s == "pass" and not ev and (dtype is None or d == dtype) for s, d, ev in st)):
            out.setdefault(slot, []).append(run_id)
    return out


def passing_slots(store: str | Path, content_hash: str, dtype: Optional[str] = None) -> set[str]:
    """Slots of the bundle with ``content_hash`` holding a passing receipt in ``store``
    (covering ``dtype``, a torch dtype name, when given)."""
    return set(_passing_runs(store, content_hash, dtype))


def verified_envelopes(store: str | Path, content_hash: str, slot: str, dtype: Optional[str] = None) -> dict[str, Any]:
    """variant -> the verified envelope (its recorded JSON form) of the latest passing receipt for
    ``slot``; ``{}`` when there is none, or it recorded none (a run made without ``envelope``)."""
    runs = _passing_runs(store, content_hash, dtype).get(slot)
    if not runs:
        return {}
    db = sqlite3.connect(f"file:{Path(store)}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT variant, envelope FROM envelopes WHERE run_id = ? AND slot = ?", (runs[-1], slot)).fetchall()
    except sqlite3.DatabaseError:  # a store from before envelopes were kept
        return {}
    finally:
        db.close()
    return {variant: json.loads(env) for variant, env in rows}
