"""The peer benchmark's bookkeeping (benchmarks/moe_decode.py, benchmarks/peer_table.py): a figure
above the row's read limit is flagged, and the table is the median over runs of each run's
ratio. No peer is built here (that needs a source tree outside the repository)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_a_figure_above_the_read_limit_is_flagged():
    md = _load("moe_decode")
    assert md.probe_verdict("ik", 20.5, 20.0) == "ik 20.5 GB/s > probe 20.0"
    assert md.probe_verdict("ours", 20.0, 20.0) is None and md.probe_verdict("ours", 3.0, 20.0) is None


def test_peer_table_takes_the_median_over_runs_and_marks_flags():
    pt = _load("peer_table")

    def run(r_ik, frac, flag):
        return {"isa": "avx512bf16", "cases": [{"label": "mxfp4", "format": "mxfp4", "T": 1, "fraction_of_bandwidth": frac,
                                                "probe_is_wrong": flag, "peers": {"ik": {"speedup_vs_peer": r_ik}}}]}
    text = pt.table([run(0.5, 0.4, []), run(0.9, 0.5, []), run(0.7, 0.6, ["ik 30 GB/s > probe 20"])])
    assert "| mxfp4 | 0.70! (0.50, 0.90, 0.70) |" in text
    assert "| mxfp4 | 50! (40, 50, 60) |" in text
    assert "ISA avx512bf16; 3 run(s)" in text
