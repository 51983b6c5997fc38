"""The leaderboard: one read-only HTML page of a service store.

Per slot, the verified variants (first submissions whose row passed; copies are credited to the
first) ranked by their median speedup against the incumbent, with the lowest and highest over the
timed profiles and the device they were measured on; a variant with no timing is listed after the
timed ones. Speedups are never compared across devices as if equal: each row names its device, and
each was measured within one job on that device. Then the verdict counts per slot, the copies and
duplicates, and every submission's history (its attempts) with its report link.
"""
from __future__ import annotations

import collections
import html
import time
from typing import Callable

from kernelslot.service.store import ServiceStore

__all__ = ["render_leaderboard"]

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0 16px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f2f2f2}td.n{text-align:right;font-variant-numeric:tabular-nums}.pass{color:#176f2c}.fail{color:#b00020}
.invalid,.notrun{color:#8a6d00}.muted{color:#777}
"""


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"x{x:.2f}"


def _cls(status: str | None) -> str:
    return {"not run": "notrun"}.get(status or "", status or "")


def render_leaderboard(store: ServiceStore, report_link: Callable[[int], str] = lambda sid: f"/reports/{sid}.html",
                       history_limit: int = 500) -> str:
    """The page for ``store``; ``report_link(id)`` is the URL of a submission's HTML report."""
    subs = store.submissions()
    copies = collections.Counter(s["first_id"] for s in subs if s["relation"] == "copy")
    dups = collections.Counter(s["first_id"] for s in subs if s["relation"] == "duplicate")
    rows = list(store.variant_rows())
    slots: dict[str, list[dict]] = collections.defaultdict(list)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        counts[r["slot"]][r["status"]] += 1
        if r["status"] == "pass":
            slots[r["slot"]].append(r)
    esc = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>kernelslot leaderboard</title><style>{CSS}</style>"
           "</head><body><h1>kernelslot leaderboard</h1>"]
    states = collections.Counter(s["state"] for s in subs)
    statuses = collections.Counter(s["status"] for s in subs if s["state"] == "done" and not s["relation"])
    out.append(f"<p id='summary'>{len(subs)} submissions: {statuses['pass']} passed, {statuses['fail']} failed, "
               f"{statuses['not run']} not run, {statuses['invalid']} invalid; {sum(copies.values())} copies of a pass, "
               f"{sum(dups.values())} duplicates of a fail or not run; {states['queued'] + states['waiting']} queued, "
               f"{states['running']} running. <span class='muted'>Written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}."
               "</span></p>")
    if not slots:
        out.append("<p>No verified variant yet.</p>")
    for slot in sorted(set(slots) | set(counts)):
        ranked = sorted(slots.get(slot, []), key=lambda r: (r["speedup"] is None, -(r["speedup"] or 0.0)))
        c = counts[slot]
        out.append(f"<h2>{esc(slot)}</h2><p class='muted'>verdicts: {c['pass']} pass, {c['fail']} fail, "
                   f"{c['not run']} not run</p>")
        out.append(f"<table class='board' data-slot='{esc(slot)}'><tr><th>#</th><th>variant</th><th>submitter</th>"
                   "<th>speedup (median)</th><th>lowest – highest</th><th>timed profiles</th><th>device</th>"
                   "<th>copies</th><th>submission</th></tr>")
        for i, r in enumerate(ranked, 1):
            sid = r["submission_id"]
            out.append(f"<tr><td class='n'>{i}</td><td>{esc(r['variant'])}</td><td>{esc(r['submitter'] or '-')}</td>"
                       f"<td class='n'>{_fmt(r['speedup'])}</td><td class='n'>{_fmt(r['speedup_lo'])} – {_fmt(r['speedup_hi'])}</td>"
                       f"<td class='n'>{r['timed']}</td><td>{esc(r['device'] or '-')}</td><td class='n'>{copies[sid]}</td>"
                       f"<td><a href='{esc(report_link(sid))}'>#{sid}</a></td></tr>")
        out.append("</table>")
    reported = store.reported()
    attempts = collections.defaultdict(list)
    for a in store.attempts():
        attempts[a["submission_id"]].append(a)
    out.append("<h2>Submissions</h2><table id='history'><tr><th>#</th><th>received (UTC)</th><th>submitter</th>"
               "<th>bundle</th><th>status</th><th>reason</th><th>attempts</th><th>report</th></tr>")
    for s in reversed(subs[-history_limit:]):
        hist = "; ".join(f"{a['number']}: {a['outcome']} on {a['worker']}" + (f" ({a['message']})" if a["message"] else "")
                         for a in attempts[s["id"]]) or "-"
        report = s["id"] if s["id"] in reported else s["first_id"] if s["first_id"] in reported else None
        link = f"<a href='{esc(report_link(report))}'>report</a>" if report is not None else "-"
        status = s["status"] or s["state"]
        out.append(f"<tr><td class='n'>{s['id']}</td><td>{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(s['received']))}</td>"
                   f"<td>{esc(s['submitter'] or '-')}</td><td>{esc(s['bundle_id'] or '-')} <span class='muted'>"
                   f"{s['hash'][:12]}</span></td><td class='{_cls(s['status'])}'>{esc(status)}</td>"
                   f"<td>{esc(s['reason'] or '')}</td><td>{esc(hist)}</td><td>{link}</td></tr>")
    out.append("</table></body></html>")
    return "".join(out)

