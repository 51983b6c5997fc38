"""The JSON report: one payload per ``kernelslot verify`` run (schema: docs/report-schema.md).

``schema_version`` is bumped only for incompatible changes; readers ignore fields they do not
know, so later referee versions may add plain fields to a run, a slot or a result. Each result
carries ``columns``: the state of every table column (``COLUMNS`` of the text table, the same
names, each summarising the named checks), so the JSON, the terminal table and the HTML page
agree on what a column means.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from kernelslot.report.table import COLUMNS
from kernelslot.verify.verdict import FAIL, PASS, SKIP, SlotReport, run_evidence, verdict_text

SCHEMA_VERSION = 1
KIND = "kernelslot.verify"
NOT_RUN = "not_run"


class ReportError(ValueError):
    """An input report that cannot be read (one line: which file and why)."""


def column_state(checks: Iterable[dict[str, Any]], names: tuple[str, ...]) -> str:
    """fail if any named check failed, pass if one passed, else skip (none ran, or all skipped)."""
    states = [c.get("status") for c in checks if c.get("name") in names]
    if FAIL in states:
        return FAIL
    if PASS in states:
        return PASS
    return SKIP


def _result_dict(rd: dict[str, Any]) -> dict[str, Any]:
    checks = rd.get("checks") or []
    if rd.get("skipped_reason"):
        rd["columns"] = {name: SKIP for name, _ in COLUMNS}
    else:
        rd["columns"] = {name: column_state(checks, names) for name, names in COLUMNS}
    return rd


def slot_dict(report: SlotReport, comparator: str) -> dict[str, Any]:
    d = report.to_dict()
    d["comparator"] = comparator
    d["results"] = [_result_dict(rd) for rd in d["results"]]
    return d


def build_payload(slots: list[dict[str, Any]], *, passed: bool, elapsed_s: float, device: str, runner: str,
                  seeds: list[int], bundle: dict[str, Any] | None, command: str = "", timed: bool = False,
                  **extra: Any) -> dict[str, Any]:
    """The report of one run; ``extra`` becomes plain top-level fields."""
    from kernelslot import __version__

    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "version": __version__, "command": command,
            "passed": passed, "status": PASS if passed else FAIL, "elapsed_s": elapsed_s, "device": device,
            "runner": runner, "seeds": list(seeds), "timed": timed, "bundle": bundle,
            "columns": [{"name": name, "checks": list(checks)} for name, checks in COLUMNS],
            **extra, "slots": slots}


def load_payload(path: str | Path) -> dict[str, Any]:
    """Read a ``--json`` report, checking the kind and schema version."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{p}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{p}: not a kernelslot JSON report ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or not isinstance(data.get("slots"), list):
        raise ReportError(f"{p}: not a kernelslot JSON report (no kind = {KIND!r} with a slots list)")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ReportError(f"{p}: schema_version {version!r} is not supported by this kernelslot "
                          f"(it reads versions up to {SCHEMA_VERSION})")
    return data


def payload_from_store(store: Any, run_id: int) -> dict[str, Any]:
    """A stored run as a report payload (the same shape a ``--json`` file has)."""
    from kernelslot.slots import CATALOG

    run = store.run(run_id)
    slots: dict[str, dict[str, Any]] = {}
    for r in store.results(run_id):
        s = slots.setdefault(r["slot"], {"slot": r["slot"], "kernel": r["kernel"], "runner": run["runner"],
                                         "device": run["device"], "results": [], "errors": []})
        s["results"].append(_result_dict(r))
    for e in store.slot_errors(run_id):
        slots.setdefault(e["slot"], {"slot": e["slot"], "kernel": "-", "runner": run["runner"],
                                     "device": run["device"], "results": [], "errors": []})["errors"].append(e["message"])
    envelopes = store.envelopes(run_id)
    for s in slots.values():
        s["envelope"] = envelopes.get(s["slot"], {})
        ran = [r for r in s["results"] if not r.get("skipped_reason")]
        s["passed"] = not s["errors"] and bool(ran) and all(r["status"] == PASS for r in ran)
        s["status"] = PASS if s["passed"] else FAIL
        s["evidence"] = run_evidence(list(dict.fromkeys((r["kernel"], r.get("evidence", "")) for r in ran)))  # by variant
        s["verdict"] = verdict_text(s["status"], s["evidence"])
        defn = CATALOG.get(s["slot"])
        s["comparator"] = defn.describe_comparator() if defn else ""
    timed = any(r.get("timing") for s in slots.values() for r in s["results"])
    bundle = {"id": run["bundle_id"], "sha256": run["bundle_hash"]} if run["bundle_id"] else None
    payload = build_payload(list(slots.values()), passed=run["status"] == PASS,
                            elapsed_s=(run["finished"] or run["started"]) - run["started"], device=run["device"],
                            runner=run["runner"], seeds=json.loads(run["seeds"] or "[]"), bundle=bundle,
                            command=run["command"] or "", timed=timed, store_run=run_id)
    payload["status"] = run["status"] or NOT_RUN
    payload["evidence"] = run_evidence([(s["slot"], s["evidence"]) for s in slots.values()])
    payload["verdict"] = verdict_text(payload["status"], payload["evidence"])
    return payload
