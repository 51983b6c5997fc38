"""Human-readable verification tables (one per slot) and failure reasons."""
from __future__ import annotations

from kernelslot.verify.envelope import describe_envelope
from kernelslot.verify.verdict import FAIL, PASS, SKIP, Check, ProfileResult, SlotReport

# Table columns: a heading and the checks it summarises (a column fails if any of its checks fails).
COLUMNS = (
    ("prep", (Check.PREPARE,)),
    ("abi", (Check.RAISED, Check.RETURNED_VALUE, Check.OUTPUT_STORAGE_SWAPPED, Check.OUTPUT_ALIASES_INPUT, Check.RETAINED_TENSOR,
             Check.GLOBAL_STATE_CHANGED)),
    ("inputs", (Check.INPUT_MUTATED,)),
    ("poison", (Check.POISON_LEFT,)),
    ("bounds", (Check.OUT_OF_BOUNDS_WRITE,)),
    ("compare", (Check.COMPARE, Check.AUDIT)),
    ("replay", (Check.REPLAY, Check.REPREPARE, Check.DETERMINISM, Check.METAMORPHIC)),
    ("graph", (Check.GRAPH_REPLAY,)),
)
MARK = {PASS: "ok", FAIL: "FAIL", SKIP: "-"}


def _cell(result: ProfileResult, checks: tuple[str, ...]) -> str:
    statuses = [c.status for c in result.checks if c.name in checks]
    if not statuses:
        return "-"
    if FAIL in statuses:
        return MARK[FAIL]
    return MARK[PASS] if PASS in statuses else MARK[SKIP]


def _metric(result: ProfileResult) -> str:
    parts = [f"{k}={v:.4g}" for k, v in sorted(result.metrics.items())]
    t = result.timing
    if "candidate_s" in t:
        ms = lambda side: f"{t[side + '_s'] * 1e3:.3g}ms [{t[side + '_q1_s'] * 1e3:.3g}-{t[side + '_q3_s'] * 1e3:.3g}]"
        text = "cand " + ms("candidate")
        if "incumbent_s" in t:
            text += f" inc {ms('incumbent')}" + (f" x{t['speedup']:.2f}" if "speedup" in t else "") \
                + (" (noise: the pair ratios bracket 1)" if t.get("noise") and "speedup" in t else "")
        if "floor_s" in t:
            text += f" floor {t['floor_s'] * 1e6:.3g}us" + (" IMPOSSIBLE (below the physics floor)" if t.get("impossible") else "")
        if "candidate_roundtrip_s" in t:
            text += f" rt {t['candidate_roundtrip_s'] * 1e3:.3g}ms"
        parts.append(text)
    return " ".join(parts)


def render_slot(report: SlotReport, comparator: str) -> str:
    evidence = f"; evidence: {report.evidence}" if report.evidence else ""
    lines = [f"{report.slot}  [{report.kernel}; {report.runner}; {report.device}{evidence}]  comparator: {comparator}"]
    if report.not_run:
        return "\n".join(lines + [f"  => NOT RUN: {report.not_run} (not a failure of the candidate)"])
    header = ["profile", "dtype", "model", "seed", "status"] + [c for c, _ in COLUMNS] + ["metrics"]
    rows = []
    for r in report.results:
        if r.skipped_reason:
            rows.append([r.profile, r.dtype, r.model, str(r.seed), "skip"] + ["-"] * len(COLUMNS) + [r.skipped_reason])
            continue
        rows.append([r.profile, r.dtype, r.model, str(r.seed), "PASS" if r.passed else "FAIL"]
                    + [_cell(r, checks) for _, checks in COLUMNS] + [_metric(r)])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = lambda row: "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
    lines.append(fmt(header))
    lines.extend(fmt(row) for row in rows)
    for r in report.results:
        for c in r.failures():
            first_line = c.message.strip().splitlines()[0] if c.message.strip() else ""
            lines.append(f"  ! {r.profile}[{r.dtype}] seed {r.seed}: {c.name}: {first_line}")
    for r in report.results:
        if r.drawn:
            dims = " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in r.drawn["dims"].items())
            lines.append(f"  drawn {r.profile}[{r.dtype}] (--seed-base {r.drawn['seed']}): {dims}")
    for e in report.errors:
        lines.append(f"  ! {e}")
    for note in report.notes:
        lines.append(f"  note: {note}")
    for variant, env in report.envelope.items():
        lines.append(f"  verified envelope of {variant}: {describe_envelope(env)}")
    ran = [r for r in report.results if not r.skipped_reason]
    passed = sum(r.passed for r in ran)
    lines.append(f"  => {'PASS' if report.passed else 'FAIL'}{f' ({report.evidence})' if report.evidence else ''}: "
                 f"{passed}/{len(ran)} profile runs passed"
                 + (f", {len(report.results) - len(ran)} skipped" if len(ran) != len(report.results) else "")
                 + (f"; {len(report.errors)} slot-level problem{'s' * (len(report.errors) > 1)} (! above)" if report.errors else ""))
    return "\n".join(lines)
