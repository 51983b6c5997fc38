"""One self-contained HTML page for a report payload (no scripts, no external assets).

Sections: the run (verdict, bundle and hash, device, runner, seeds and how to reproduce); an
overview matrix per slot (profile × dtype, one coloured cell per verdict); the verdict table
(profile × dtype × seed under a row per slot, with every column's state — the same columns as the terminal
table and the JSON ``columns``); the failures with their first lines (full text folded); and,
for a timed run, an inline SVG per slot of candidate vs incumbent median time per profile with
the spread ((max−min)/median of the repetitions) drawn as a whisker.
"""
from __future__ import annotations

from html import escape
from typing import Any

_STATE_CLASS = {"pass": "st-pass", "fail": "st-fail", "skip": "st-skip"}
_MARK = {"pass": "ok", "fail": "FAIL", "skip": "–"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dde;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px} code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:700;color:#fff}
.v-pass{background:#1e7d32}.v-fail{background:#c62828}.v-other{background:#8d6e00}
table{border-collapse:collapse;margin:6px 0 12px} th,td{border:1px solid #d5d9e2;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f1f3f8;font-weight:600} td.c{text-align:center}
.st-pass{background:#e3f4e4;color:#1b5e20}.st-fail{background:#fbe0e0;color:#b71c1c;font-weight:700}.st-skip{background:#f4f4f4;color:#888}
.slotrow th{background:#e6e9f2;text-align:left}
dl.run{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:10px 0} dl.run dt{color:#556;font-weight:600}
dl.run dd{margin:0} details{margin:2px 0} summary{cursor:pointer} .msg{white-space:pre-wrap;margin:4px 0 8px 18px;color:#333}
.fail-line{color:#b71c1c} .legend span{display:inline-block;padding:0 6px;margin-right:6px;border:1px solid #d5d9e2}
.note{color:#556;font-size:12.5px} td.mono{min-width:180px;max-width:420px;overflow-wrap:anywhere}
"""


def _state(s: str) -> str:
    return _STATE_CLASS.get(s, "st-skip")


def _first_line(text: str) -> str:
    text = (text or "").strip()
    return text.splitlines()[0] if text else ""


def _run_section(p: dict[str, Any]) -> list[str]:
    status = p.get("status") or ("pass" if p.get("passed") else "fail")
    cls = {"pass": "v-pass", "fail": "v-fail"}.get(status, "v-other")
    bundle = p.get("bundle")
    seeds = p.get("seeds") or []
    evidence = p.get("evidence") if status in ("pass", "fail") else ""  # e.g. triton-interpreter on cpu; CUDA not run
    rows = [("verdict", f'<span class="verdict {cls}" id="verdict">{escape(status.upper())}</span>'
                        + (f' <span class="note" id="evidence">({escape(evidence)})</span>' if evidence else "")),
            ("bundle", escape(f"{bundle['id']}  sha256 {bundle['sha256']}") if bundle else "built-in kernels"),
            ("device / runner", escape(f"{p.get('device', '?')} / {p.get('runner', '?')}")),
            ("seeds", escape(", ".join(map(str, seeds)) or "-")),
            ("elapsed", escape(f"{p.get('elapsed_s', 0):.1f} s")),
            ("kernelslot", escape(f"{p.get('version', '?')} (report schema {p.get('schema_version')})"))]
    if p.get("command"):
        rows.append(("command", f"<code>{escape(p['command'])}</code>"))
    if seeds:
        cmd = p.get("command") or "kernelslot verify ..."
        again = cmd if "--seed-base" in cmd else f"{cmd} --seed-base {seeds[0]}"
        rows.append(("reproduce", f"<code>{escape(again)}</code> "
                                  '<span class="note">(the same inputs, in the same order)</span>'))
    if p.get("store_run") is not None:
        rows.append(("stored run", escape(str(p["store_run"]))))
    out = ["<dl class=\"run\">"] + [f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows] + ["</dl>"]
    return out


def _overview(slot: dict[str, Any]) -> list[str]:
    results = slot.get("results", [])
    dtypes = list(dict.fromkeys(r["dtype"] for r in results))
    profiles = list(dict.fromkeys(r["profile"] for r in results))
    cell: dict[tuple[str, str], list[str]] = {}
    for r in results:
        cell.setdefault((r["profile"], r["dtype"]), []).append(r.get("status", "skip"))
    out = [f'<table class="overview" data-slot="{escape(slot["slot"])}"><tr><th>profile</th>'
           + "".join(f"<th>{escape(d)}</th>" for d in dtypes) + "</tr>"]
    for prof in profiles:
        tds = []
        for d in dtypes:
            states = cell.get((prof, d))
            if not states:
                tds.append('<td class="c"></td>')
                continue
            s = "fail" if "fail" in states else "pass" if "pass" in states else "skip"
            tds.append(f'<td class="c {_state(s)}">{_MARK.get(s, escape(s))}</td>')
        out.append(f"<tr><th>{escape(prof)}</th>{''.join(tds)}</tr>")
    out.append("</table>")
    return out


def _matrix(p: dict[str, Any]) -> list[str]:
    columns = [c["name"] for c in p.get("columns", [])]
    head = ["profile", "model", "dtype", "seed", "verdict"] + columns + ["metrics / reason"]  # grouped by slot
    out = ['<table id="matrix"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for slot in p.get("slots", []):
        verdict = slot.get("status") or ("pass" if slot.get("passed") else "fail")  # pass, fail or not run
        why = f" (not run: {slot['not_run']})" if slot.get("not_run") else ""
        why += f"; evidence: {slot['evidence']}" if slot.get("evidence") else ""
        out.append(f'<tr class="slotrow"><th colspan="{len(head)}">{escape(slot["slot"])} '
                   f'<span class="{_state(verdict)}">&nbsp;{verdict.upper()}&nbsp;</span> '
                   f'<span class="note">{escape(slot.get("kernel", ""))}; comparator: {escape(slot.get("comparator", ""))}'
                   f"{escape(why)}</span></th></tr>")
        for r in slot.get("results", []):
            st = r.get("status", "skip")
            cols = r.get("columns", {})
            failed = next((c for c in r.get("checks", []) if c.get("status") == "fail"), None)
            extra = r.get("skipped_reason") or (f"{failed['name']}: {_first_line(failed.get('message', ''))[:140]}"
                                                 if failed else "") \
                or " ".join(f"{k}={v:.4g}" if isinstance(v, (int, float)) else f"{k}={v}"
                            for k, v in sorted((r.get("metrics") or {}).items()))
            cells = [escape(r["profile"]), escape(str(r.get("model", ""))), escape(r["dtype"]),
                     escape(str(r.get("seed", "")))]
            out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells)
                       + f'<td class="c {_state(st)}" data-check="verdict">{_MARK.get(st, escape(st))}</td>'
                       + "".join(f'<td class="c {_state(cols.get(c, "skip"))}" data-check="{escape(c)}">'
                                 f'{_MARK.get(cols.get(c, "skip"), escape(str(cols.get(c))))}</td>' for c in columns)
                       + f'<td class="mono">{escape(extra)}</td></tr>')
    out.append("</tbody></table>")
    legend = " ".join(f'<span title="{escape(", ".join(c["checks"]))}"><b>{escape(c["name"])}</b>: '
                      f'{escape(", ".join(c["checks"]))}</span>' for c in p.get("columns", []))
    out.append(f'<p class="legend note">Columns and the checks each summarises: {legend} '
               '<span class="st-pass">ok</span> passed, <span class="st-fail">FAIL</span> failed, '
               '<span class="st-skip">–</span> skipped or not applicable.</p>')
    return out


def _failures(p: dict[str, Any]) -> list[str]:
    out = []
    for slot in p.get("slots", []):
        for e in slot.get("errors", []):
            out.append(f'<details open><summary class="fail-line">{escape(slot["slot"])}: '
                       f"{escape(_first_line(e))}</summary><div class=\"msg mono\">{escape(e)}</div></details>")
        for r in slot.get("results", []):
            for c in r.get("checks", []):
                if c.get("status") != "fail":
                    continue
                where = f"{slot['slot']} {r['profile']}[{r['dtype']}] seed {r.get('seed')}: {c['name']}"
                out.append(f'<details><summary class="fail-line">{escape(where)}: {escape(_first_line(c.get("message", "")))}'
                           f'</summary><div class="msg mono">{escape(c.get("message", ""))}</div></details>')
    return out or ['<p id="no-failures">No failures.</p>']


def _bar_chart(slot: dict[str, Any]) -> list[str]:
    """Candidate vs incumbent median time per profile run, whiskers = ± spread/2 around the median."""
    rows = [r for r in slot.get("results", []) if (r.get("timing") or {}).get("candidate_s")]
    if not rows:
        return []
    # the axis fits every median with room to spare; a whisker past the edge is clipped (drawn to it)
    top = 1.25 * max(max(r["timing"].get(f"{w}_s", 0) for w in ("candidate", "incumbent")) for r in rows) or 1.0
    label_w, plot_w, bar_h, gap = 260, 440, 9, 8
    height = len(rows) * (2 * bar_h + gap) + 34
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timing" data-slot="{escape(slot["slot"])}" '
           f'width="{label_w + plot_w + 150}" height="{height}" font-family="system-ui,sans-serif" font-size="11">']
    colours = {"candidate": "#1565c0", "incumbent": "#9e9e9e"}
    y = 10
    for r in rows:
        t = r["timing"]
        svg.append(f'<text x="{label_w - 6}" y="{y + bar_h + 3}" text-anchor="end">{escape(r["profile"])}[{escape(r["dtype"])}]</text>')
        for i, who in enumerate(("candidate", "incumbent")):
            med = t.get(f"{who}_s")
            yy = y + i * bar_h
            if med is None:
                continue
            w = plot_w * med / top
            spread = t.get(f"{who}_spread", 0) * med
            lo, hi = plot_w * max(med - spread / 2, 0) / top, min(plot_w * (med + spread / 2) / top, plot_w)
            svg.append(f'<rect x="{label_w}" y="{yy}" width="{w:.1f}" height="{bar_h - 1}" fill="{colours[who]}">'
                       f"<title>{who}: {med * 1e3:.4g} ms, spread {t.get(f'{who}_spread', 0):.2f}</title></rect>")
            mid = yy + (bar_h - 1) / 2
            svg.append(f'<line x1="{label_w + lo:.1f}" x2="{label_w + hi:.1f}" y1="{mid}" y2="{mid}" stroke="#222" stroke-width="1"/>')
            svg.append(f'<text x="{label_w + plot_w + 4}" y="{yy + bar_h - 1}" fill="{colours[who]}">{med * 1e3:.3g} ms</text>')
        if t.get("speedup"):
            svg.append(f'<text x="{label_w + plot_w + 146}" y="{y + bar_h + 3}" text-anchor="end" font-weight="600">'
                       f'×{t["speedup"]:.2f}</text>')
        y += 2 * bar_h + gap
    svg.append(f'<rect x="{label_w}" y="{y + 6}" width="10" height="8" fill="{colours["candidate"]}"/>'
               f'<text x="{label_w + 14}" y="{y + 14}">candidate</text>'
               f'<rect x="{label_w + 90}" y="{y + 6}" width="10" height="8" fill="{colours["incumbent"]}"/>'
               f'<text x="{label_w + 104}" y="{y + 14}">incumbent (built-in)</text>'
               f'<text x="{label_w + 250}" y="{y + 14}">whisker: spread (max−min) of the repetitions</text>')
    svg.append("</svg>")
    return [f"<h3>{escape(slot['slot'])}</h3>"] + svg


def render_html(p: dict[str, Any]) -> str:
    title = f"kernelslot report — {(p.get('bundle') or {}).get('id') or 'built-in kernels'}"
    body = [f"<h1>{escape(title)}</h1>"] + _run_section(p)
    body.append("<h2>Verdict matrix</h2>")
    for slot in p.get("slots", []):
        body += [f"<h3>{escape(slot['slot'])}</h3>"] + _overview(slot)
    body.append("<h2>Every check</h2>")
    body += _matrix(p)
    body.append("<h2>Failures</h2>")
    body += _failures(p)
    charts = [line for slot in p.get("slots", []) for line in _bar_chart(slot)]
    if charts:
        body.append("<h2>Timing: candidate vs incumbent</h2>")
        body.append('<p class="note">Median time per call of each side, measured side by side in one run on the '
                    "same inputs; the number at the right is the speedup (incumbent / candidate).</p>")
        body += charts
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
