"""``kernelslot e2e`` over slots × model classes: every op of a bundle on every class that calls it.

For each slot (a bundle's ops, or the built-ins of the slots asked for) and each model class,
one :class:`Cell`:

- **not run** with the reason when the slot has no install point, when the class has no site
  whose semantics are the slot's (install_points.py says why: "its attention has sinks", "no gated
  activation computes silu(gate)·up; gated sites found: ..."), or when no call of the class fell
  inside the bundle's declared domain ∩ verified envelope (e.g. a norm bound to ``MiniMax-M3`` in
  Qwen3-MoE);
- **fail** when the slot referee rejected the op (nothing of it is installed) or the e2e gate failed;
- **pass** when the gate passed (:func:`kernelslot.engines.e2e.run_e2e`, one slot installed alone,
  so each slot's verdict is its own).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"


@dataclass
class Cell:
    slot: str
    model: str
    dtype: str
    status: str
    reason: str = ""
    report: Any = None  # the E2EReport when it ran

    def to_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "model": self.model, "dtype": self.dtype, "status": self.status,
                "reason": self.reason, "report": self.report.to_dict() if self.report is not None else None}


def sites_or_reason(model_name: str, slot: str, sizes: Optional[dict] = None) -> Optional[str]:
    """None when ``model_name`` has a site for ``slot``; otherwise why not."""
    from kernelslot.engines.transformers.install_points import INSTALL_POINTS, not_run_reasons
    from kernelslot.engines.transformers.models import build_model

    if slot not in INSTALL_POINTS:
        return f"no install point: transformers models have no call site for {slot} in kernelslot's adapter"
    return not_run_reasons(build_model(model_name, sizes=sizes), (slot,)).get(slot)


def _never_fired(report, slot: str) -> bool:
    table = report.counters.get(slot, {})
    return not any(table.get(v, {}).get("fired", 0) or table.get(v, {}).get("fallback", 0) for v in report.qualified)


def run_matrix(models: list[str], slots: list[str], dtype: str = "float32", *, bundle: Any = None,
               store: Optional[str] = None, trust_unverified: bool = False, rejected: tuple[str, ...] = (),
               **run_kw: Any) -> list[Cell]:
    """One :class:`Cell` per (slot, model) in that order. ``rejected``: slots the referee rejected."""
    from kernelslot.engines.e2e import run_e2e

    cells = []
    for slot in slots:
        for name in models:
            if slot in rejected:
                cells.append(Cell(slot, name, dtype, FAIL, "the slot referee rejected it; nothing qualified"))
                continue
            reason = sites_or_reason(name, slot, run_kw.get("sizes"))
            if reason is not None:
                cells.append(Cell(slot, name, dtype, NOT_RUN, reason))
                continue
            report = run_e2e(name, dtype, bundle=bundle, store=store, trust_unverified=trust_unverified,
                             slots=(slot,), **run_kw)
            if bundle is not None and _never_fired(report, slot):
                cells.append(Cell(slot, name, dtype, NOT_RUN, "no call of this class fell inside the bundle's declared "
                                  "domain ∩ verified envelope", report))
            else:
                cells.append(Cell(slot, name, dtype, PASS if report.passed else FAIL, "; ".join(report.reasons), report))
    return cells


def exit_status(cells: list[Cell]) -> int:
    """0: something ran and everything that ran passed; 1: a fail; 3: nothing ran."""
    if any(c.status == FAIL for c in cells):
        return 1
    return 0 if any(c.status == PASS for c in cells) else 3
