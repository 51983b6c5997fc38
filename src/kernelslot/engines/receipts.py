"""Verify receipts in the result store, as the engines read them.

A slot of a bundle counts as verified when some ``verify`` run recorded for the bundle's
content hash has results for that slot, every non-skipped result passed, the run logged no
error for the slot, and (when a dtype is asked for) a passing result ran in that dtype. ``qualify`` runs the referee (isolated) on the slots that lack such a
receipt and records the run in the store.
"""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Optional


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


def qualify(bundle, slots: tuple[str, ...], store: str | Path, *, timeout_s: float = 30.0,
            quiet: bool = False) -> dict[str, bool]:
    """Make sure each of ``slots`` the bundle offers has a verify receipt; run the referee
    (isolated, random seeds) for those without one. Returns slot -> passed."""
    import os

    from kernelslot.slots import get_slot
    from kernelslot.store import ResultStore
    from kernelslot.verify import VerifyOptions, verify_slot
    from kernelslot.verify.worker import make_runner

    offered = {s: c for s, c in bundle.candidates().items() if s in slots}
    have = passing_slots(store, bundle.content_hash)
    result = {s: True for s in offered if s in have}
    todo = [s for s in offered if s not in have]
    if not todo:
        return result
    seed = int.from_bytes(os.urandom(4), "little")
    opts = VerifyOptions(seeds=(seed,), extra_mean=2.0)
    runner = make_runner(True, timeout_s)
    db = ResultStore(store)
    try:
        run_id = db.start_run(f"kernelslot e2e (referee) seed-base {seed}", "cpu", runner.name,
                              bundle.bundle_id, bundle.content_hash, seeds=(seed,))
        for s in todo:
            if not quiet:
                print(f"e2e: no passing receipt for {s}; running the slot referee (isolated, seed {seed}) ...",
                      file=sys.stderr, flush=True)
            report = verify_slot(get_slot(s), offered[s], opts, runner=runner)
            db.add_report(run_id, report)
            result[s] = report.passed
        db.finish_run(run_id, "pass" if all(result[s] for s in todo) else "fail")
    finally:
        runner.close()
        db.close()
    return result


def default_store() -> Optional[str]:
    """``$KERNELSLOT_STORE`` if set."""
    import os

    return os.environ.get("KERNELSLOT_STORE") or None
