"""The peer table from one or more ``moe_decode.py --peer-lib ... --json FILE`` runs.

Per case and T it prints, for each peer, the ratio peer time / our time (above 1 we are faster;
each run's value is the ratio of that row's medians over its interleaved repetitions), as the
median over the runs followed by every run's value, and our share of the row's read limit;
rows flagged ``PROBE IS WRONG`` in any run are marked ``!``.

Usage: python benchmarks/peer_table.py RUN.json [RUN2.json ...]
"""
from __future__ import annotations

import json
import statistics
import sys


def table(runs: list[dict]) -> str:
    rows: dict[tuple[str, int], list[dict]] = {}
    peers: list[str] = []
    for run in runs:
        for r in run["cases"]:
            rows.setdefault((r.get("label", r["format"]), r["T"]), []).append(r)
            peers += [p for p in r.get("peers", {}) if p not in peers]
    tokens = sorted({t for _, t in rows})
    labels = list(dict.fromkeys(lab for lab, _ in rows))
    out = [f"ISA {', '.join(sorted({run.get('isa', '?') for run in runs}))}; {len(runs)} run(s); "
           f"cells: median over runs (each run's values)"]
    for who in peers + ["% of read limit"]:
        out += ["", f"**{who}**" + (" (peer time / ours)" if who in peers else ""), "",
                "| weights | " + " | ".join(f"T={t}" for t in tokens) + " |",
                "|---|" + "---|" * len(tokens)]
        for lab in labels:
            cells = []
            for t in tokens:
                rs = rows.get((lab, t), [])
                if who in peers:
                    vals = [r["peers"][who]["speedup_vs_peer"] for r in rs if who in r.get("peers", {})]
                    fmt = "{:.2f}"
                else:
                    vals = [100 * r["fraction_of_bandwidth"] for r in rs]
                    fmt = "{:.0f}"
                flag = "!" if any(r.get("probe_is_wrong") for r in rs) else ""
                cells.append((fmt.format(statistics.median(vals)) + flag + " (" +
                              ", ".join(fmt.format(v) for v in vals) + ")") if vals else "not run")
            out.append(f"| {lab} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    runs = []
    for path in argv:
        with open(path) as f:
            runs.append(json.load(f))
    print(table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
