"""Listing and comparing stored runs (``kernelslot report --store FILE [--compare A B]``).

Runs are matched result by result on (slot, profile, dtype, model); where a run has several
seeds for one key, a check counts as failed if it failed for any seed, and timings are the
median over the seeds. A check *changed* when its state differs between the runs; a timing
*moved* when the medians differ by more than the larger of the two spreads (each spread being
(max−min)/median of that run's repetitions, times its median): a move inside the noise of the
measurement is not reported as a change.
"""
from __future__ import annotations

import datetime as _dt
import statistics
from typing import Any

Key = tuple[str, str, str, str]


def render_runs(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "no runs in the store"
    lines = [f"{'run':>4}  {'started (UTC)':19}  {'status':11}  {'results':>13}  bundle / command"]
    for r in runs:
        when = _dt.datetime.fromtimestamp(r["started"] or 0, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        counts = f"{r['passed']}/{r['total']} pass"
        who = f"{r['bundle_id']} {str(r['bundle_hash'] or '')[:12]}" if r.get("bundle_id") else "built-ins"
        lines.append(f"{r['id']:>4}  {when}  {str(r.get('status') or '-'):11}  {counts:>13}  {who}; {r.get('command') or ''}")
    lines.append("compare two: kernelslot report --store FILE --compare A B; a page: kernelslot report FILE --run N -o page.html")
    return "\n".join(lines)


def _by_key(results: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for r in results:
        key = (r["slot"], r["profile"], r["dtype"], r.get("model") or "")
        agg = out.setdefault(key, {"checks": {}, "status": set(), "times": {}, "seeds": []})
        agg["status"].add(r["status"])
        agg["seeds"].append(r.get("seed"))
        for c in r.get("checks", []):
            prev = agg["checks"].get(c["name"])
            if prev != "fail":
                agg["checks"][c["name"]] = c["status"] if prev is None or c["status"] == "fail" else prev
        for who in ("candidate", "incumbent"):
            t = (r.get("timing") or {})
            if f"{who}_s" in t:
                agg["times"].setdefault(who, []).append((t[f"{who}_s"], t.get(f"{who}_spread", 0.0)))
    return out


def _status(states: set[str]) -> str:
    return "fail" if "fail" in states else "pass" if "pass" in states else next(iter(states), "-")


def compare_runs(store: Any, a: int, b: int) -> dict[str, Any]:
    ra, rb = store.run(a), store.run(b)
    ka, kb = _by_key(store.results(a)), _by_key(store.results(b))
    changed, moved = [], []
    for key in sorted(set(ka) | set(kb)):
        if key not in ka or key not in kb:
            changed.append({"key": key, "check": "(profile)", "a": "ran" if key in ka else "absent",
                            "b": "ran" if key in kb else "absent"})
            continue
        x, y = ka[key], kb[key]
        if _status(x["status"]) != _status(y["status"]):
            changed.append({"key": key, "check": "(verdict)", "a": _status(x["status"]), "b": _status(y["status"])})
        for name in sorted(set(x["checks"]) | set(y["checks"])):
            sa, sb = x["checks"].get(name, "absent"), y["checks"].get(name, "absent")
            if sa != sb:
                changed.append({"key": key, "check": name, "a": sa, "b": sb})
        for who in ("candidate", "incumbent"):
            if who not in x["times"] or who not in y["times"]:
                continue
            ma = statistics.median(t for t, _ in x["times"][who])
            mb = statistics.median(t for t, _ in y["times"][who])
            noise = max(max(s for _, s in x["times"][who]) * ma, max(s for _, s in y["times"][who]) * mb)
            if abs(mb - ma) > noise:
                moved.append({"key": key, "who": who, "a_s": ma, "b_s": mb, "ratio": mb / ma if ma else float("inf"),
                              "noise_s": noise})
    return {"a": ra, "b": rb, "changed": changed, "moved": moved, "compared": len(set(ka) & set(kb))}


def render_comparison(cmp: dict[str, Any]) -> str:
    a, b = cmp["a"], cmp["b"]
    lines = [f"run {a['id']} ({a.get('status')}, {a.get('bundle_id') or 'built-ins'} {str(a.get('bundle_hash') or '')[:12]}) "
             f"vs run {b['id']} ({b.get('status')}, {b.get('bundle_id') or 'built-ins'} {str(b.get('bundle_hash') or '')[:12]}): "
             f"{cmp['compared']} profile runs in both"]
    if a.get("bundle_hash") != b.get("bundle_hash"):
        lines.append("  the bundle content differs between the runs")
    lines.append(f"checks changed: {len(cmp['changed'])}")
    for c in cmp["changed"]:
        slot, prof, dt, _ = c["key"]
        lines.append(f"  {slot} {prof}[{dt}] {c['check']}: {c['a']} -> {c['b']}")
    lines.append(f"timings moved beyond their spread: {len(cmp['moved'])}")
    for m in cmp["moved"]:
        slot, prof, dt, _ = m["key"]
        lines.append(f"  {slot} {prof}[{dt}] {m['who']}: {m['a_s'] * 1e3:.4g} ms -> {m['b_s'] * 1e3:.4g} ms "
                     f"(x{m['ratio']:.2f}; noise {m['noise_s'] * 1e3:.3g} ms)")
    return "\n".join(lines)
