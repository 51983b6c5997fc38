"""Qualification: run the referee (isolated) on the slots of a bundle that lack a passing verify
receipt in the result store, and record the run there (``kernelslot e2e``'s first step).

What counts as a passing receipt is :func:`kernelslot.store.receipts.passing_slots`; the engine
adapters read receipts through that module and never import the referee.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from kernelslot.store.receipts import passing_slots


def qualify(bundle, slots: tuple[str, ...], store: str | Path, *, timeout_s: float = 30.0,
            quiet: bool = False) -> dict[str, bool]:
    """Make sure each of ``slots`` the bundle offers has a verify receipt; run the referee
    (isolated, random seeds) for those without one. Returns slot -> passed."""
    import os

    from kernelslot.slots import get_slot
    from kernelslot.store import ResultStore
    from kernelslot.verify import VerifyOptions, verify_slot
    from kernelslot.verify.options import UNTRUSTED
    from kernelslot.isolation import make_runner

    offered = {s: c for s, c in bundle.candidates().items() if s in slots}
    have = passing_slots(store, bundle.content_hash)
    result = {s: True for s in offered if s in have}
    todo = [s for s in offered if s not in have]
    if not todo:
        return result
    seed = int.from_bytes(os.urandom(4), "little")
    opts = VerifyOptions(seeds=(seed,), **UNTRUSTED)  # as `kernelslot verify BUNDLE`: its plan, its envelope
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
