"""Reports a person reads: the JSON schema, the HTML page, the store's runs and their comparison."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelslot.cli import main
from kernelslot.report.html import render_html
from kernelslot.report.payload import SCHEMA_VERSION, load_payload, payload_from_store
from kernelslot.report.progress import VerifyProgress
from kernelslot.store import ResultStore
from kernelslot.report.table import COLUMNS
from kernelslot.verify.verdict import ProfileResult, SlotReport

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "examples" / "broken_partial_write"
SCHEMA_DOC = ROOT / "docs" / "report-schema.md"
FAST = ["--quiet", "--in-process", "--dtype", "float32", "--replays", "2"]


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    """A failing bundle verified once with every output: (dir, json payload)."""
    d = tmp_path_factory.mktemp("run")
    rc = main(["verify", str(BROKEN), *FAST, "--seed-base", "7", "--json", str(d / "r.json"), "--html",
               str(d / "r.html"), "--store", str(d / "s.db")])
    assert rc == 1
    return d, json.loads((d / "r.json").read_text())


def test_json_has_schema_version_and_the_table_columns(failing_run):
    _, p = failing_run
    assert p["schema_version"] == SCHEMA_VERSION and p["kind"] == "kernelslot.verify"
    assert [c["name"] for c in p["columns"]] == [name for name, _ in COLUMNS]
    r = p["slots"][0]["results"][0]
    assert list(r["columns"]) == [name for name, _ in COLUMNS]
    assert r["columns"]["poison"] == "fail" and r["status"] == "fail" and r["seed"] == 7
    every_check = {c for col in p["columns"] for c in col["checks"]}
    assert {c["name"] for c in r["checks"]} <= every_check


RUN_FIELDS = ("schema_version", "kind", "version", "command", "passed", "status", "evidence", "verdict", "elapsed_s",
              "device", "runner", "seeds", "timed", "bundle", "columns", "slots")
SLOT_FIELDS = ("slot", "kernel", "runner", "device", "results", "errors", "passed", "status", "evidence", "verdict",
               "comparator")
RESULT_FIELDS = ("slot", "profile", "dtype", "model", "seed", "kernel", "checks", "metrics", "timing",
                 "skipped_reason", "evidence", "status", "columns")


def test_schema_document_names_every_field(failing_run):
    """Every field the schema promises is present and documented (later versions may add more)."""
    _, p = failing_run
    doc = SCHEMA_DOC.read_text()
    for fields, obj in ((RUN_FIELDS, p), (SLOT_FIELDS, p["slots"][0]), (RESULT_FIELDS, p["slots"][0]["results"][0])):
        for key in fields:
            assert key in obj and f"`{key}`" in doc, key


def test_html_page_is_self_contained_and_shows_the_failure(failing_run):
    d, p = failing_run
    page = (d / "r.html").read_text()
    assert "<script" not in page and not re.search(r"(src|href)=\"(https?:)?//", page)
    assert 'id="matrix"' in page and "norm.rmsnorm" in page and "poison_left" in page and "seed-base 7" in page
    assert page.count('data-check="poison"') == len(p["slots"][0]["results"])


def test_report_rebuilds_the_page_from_json_and_from_the_store(failing_run, tmp_path, capsys):
    d, p = failing_run
    assert main(["report", str(d / "r.json"), "-o", str(tmp_path / "from_json.html")]) == 0
    assert (tmp_path / "from_json.html").read_text() == render_html(load_payload(d / "r.json"))
    assert main(["report", str(d / "s.db"), "-o", str(tmp_path / "from_store.html")]) == 0
    page = (tmp_path / "from_store.html").read_text()
    assert page.count('data-check="poison"') == len(p["slots"][0]["results"]) and "poison_left" in page


@dataclasses.dataclass
class ExtendedResult(ProfileResult):
    sandbox: str = "none"  # a plain field a later version adds: kept in the store's extra column


def _report(status: str, cand_s: float, spread: float = 0.05) -> SlotReport:
    r = ExtendedResult("norm.rmsnorm", "decode_batch", "float32", "generic", 3, "k")
    r.record("compare", status, "" if status == "pass" else "matched_ratio=0.5 (< 0.99)\nmore")
    r.record("poison_left", "pass")
    r.timing = {"candidate_s": cand_s, "candidate_spread": spread, "incumbent_s": 1e-3, "incumbent_spread": spread}
    return SlotReport("norm.rmsnorm", "k", "in-process", "cpu", [r])


def test_store_keeps_runs_checks_timings_and_compares_two(tmp_path, capsys):
    db = tmp_path / "s.db"
    store = ResultStore(db)
    for status, t in (("pass", 1e-3), ("fail", 3e-3)):
        run = store.start_run("kernelslot verify", "cpu", "in-process", "b", "abc123", seeds=[3], sandbox_mode="none")
        store.add_report(run, _report(status, t))
        store.finish_run(run, status)
    assert [c["name"] for c in store.results(1)[0]["checks"]] == ["compare", "poison_left"]
    assert store.results(1)[0]["sandbox"] == "none"
    store.close()
    assert main(["report", "--store", str(db)]) == 0
    listing = capsys.readouterr().out
    assert re.search(r"^\s+1 .* pass .*1/1 pass", listing, re.M) and re.search(r"^\s+2 .* fail", listing, re.M)
    assert main(["report", "--store", str(db), "--compare", "1", "2"]) == 0
    text = capsys.readouterr().out
    assert "norm.rmsnorm decode_batch[float32] compare: pass -> fail" in text
    assert "timings moved beyond their spread: 1" in text and "candidate: 1 ms -> 3 ms (x3.00" in text
    assert "incumbent" not in text.split("timings moved")[1]  # unchanged incumbent is not reported


def test_timing_inside_the_spread_is_not_a_move(tmp_path, capsys):
    store = ResultStore(tmp_path / "s.db")
    for t in (1e-3, 1.3e-3):
        run = store.start_run("v", "cpu", "in-process", None, None)
        store.add_report(run, _report("pass", t, spread=0.5))
    store.close()
    assert main(["report", "--store", str(tmp_path / "s.db"), "--compare", "1", "2"]) == 0
    assert "timings moved beyond their spread: 0" in capsys.readouterr().out


def test_old_store_files_gain_the_new_columns(tmp_path):
    import sqlite3

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as c:
        c.executescript("CREATE TABLE runs (id INTEGER PRIMARY KEY, started REAL, command TEXT, device TEXT, runner TEXT,"
                        " bundle_id TEXT, bundle_hash TEXT, version TEXT);"
                        "CREATE TABLE results (run_id INTEGER, slot TEXT, kernel TEXT, profile TEXT, dtype TEXT,"
                        " model TEXT, seed INTEGER, status TEXT, failed_checks TEXT, checks TEXT, metrics TEXT, timing TEXT);")
    store = ResultStore(db)
    run = store.start_run("v", "cpu", "in-process", None, None, seeds=[1])
    store.add_report(run, _report("pass", 1e-3))
    assert store.results(run)[0]["timing"]["candidate_s"] == 1e-3
    store.close()


def test_progress_is_plain_when_piped_and_live_on_a_terminal(capsys):
    class Tty:
        def __init__(self):
            self.chunks = []

        def write(self, s):
            self.chunks.append(s)

        def flush(self):
            pass

        def isatty(self):
            return True

    from kernelslot.verify import VerifyOptions

    opts = VerifyOptions()
    targets = [("activation.silu_and_mul", [])]
    r = ProfileResult("activation.silu_and_mul", "single_token", "float32", "generic", 0, "k")
    piped = VerifyProgress(targets, opts)  # stderr is captured: not a terminal
    with piped:
        piped.start_slot("activation.silu_and_mul")
        piped.profile_done(r)
    assert capsys.readouterr().err == "[1/1] verifying activation.silu_and_mul ...\n"
    tty = Tty()
    live = VerifyProgress(targets, opts, stream=tty)
    with live:
        live.start_slot("activation.silu_and_mul")
        live.profile_done(r)
        live._progress.refresh()
    out = "".join(tty.chunks)
    assert "\x1b[" in out and "1/15" in out and "left" in out


def _browser() -> str | None:
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.slow
@pytest.mark.skipif(_browser() is None, reason="no headless browser installed (apt-get install -y chromium)")
def test_a_real_browser_renders_the_matrix(failing_run, tmp_path):
    d, p = failing_run
    cmd = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(cmd + ["--dump-dom", (d / "r.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rows = re.findall(r'<td class="c st-fail" data-check="poison">FAIL</td>', dom.stdout)
    assert len(rows) == len(p["slots"][0]["results"]) and 'id="verdict">FAIL<' in dom.stdout
    shot = tmp_path / "page.png"
    res = subprocess.run(cmd + [f"--screenshot={shot}", "--window-size=1280,900", (d / "r.html").as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and shot.stat().st_size > 20_000, res.stderr[-2000:]  # a blank page is ~5 kB


def test_an_interrupted_run_keeps_every_finished_slot(tmp_path, capsys, monkeypatch):
    import kernelslot.verify as verify

    real = verify.verify_slot

    def stop_at_the_second_slot(defn, *args, **kw):
        if defn.name == "norm.rmsnorm":
            raise KeyboardInterrupt
        return real(defn, *args, **kw)

    monkeypatch.setattr(verify, "verify_slot", stop_at_the_second_slot)
    rc = main(["verify", "--slot", "activation.silu_and_mul", "--slot", "norm.rmsnorm", *FAST,
               "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"), "--store", str(tmp_path / "s.db")])
    assert rc == 130 and "interrupted" in capsys.readouterr().err
    p = json.loads((tmp_path / "r.json").read_text())
    assert p["status"] == "interrupted" and [s["slot"] for s in p["slots"]] == ["activation.silu_and_mul"]
    assert "activation.silu_and_mul" in (tmp_path / "r.html").read_text()
    store = ResultStore(tmp_path / "s.db")
    assert store.runs()[0]["status"] == "interrupted" and store.runs()[0]["total"] > 0
    store.close()


def test_the_store_keeps_each_variants_verified_envelope_and_reads_it_back(tmp_path):
    from kernelslot.abi import CallDescriptor
    from kernelslot.report.payload import payload_from_store
    from kernelslot.verify.envelope import envelope_domain

    staircase = {"num_tokens": [1, 64], "hidden_size": [8, 4096],
                 "corners": [{"num_tokens": 32, "hidden_size": 4096}, {"num_tokens": 64, "hidden_size": 2048}]}
    report = _report("pass", 1e-3)
    report.envelope = {"k": staircase, "box": {"world_size": [2, 4]}}  # a one-field box, as the collective referee writes
    store = ResultStore(tmp_path / "s.db")
    run = store.start_run("v", "cpu", "in-process", None, None)
    store.add_report(run, report)
    assert store.envelopes(run) == {"norm.rmsnorm": report.envelope}
    env = payload_from_store(store, run)["slots"][0]["envelope"]
    store.close()
    assert env == report.envelope
    assert not envelope_domain(env["k"]).matches(CallDescriptor(num_tokens=64, hidden_size=4096))
    assert envelope_domain(env["box"]).matches(CallDescriptor(world_size=3))


def test_an_interpreted_pass_is_stored_with_its_evidence_and_is_no_receipt(tmp_path):
    """A pass under Triton's interpreter is kept with what it rests on; engines never admit a bundle on it,
    while an interpreted failure still blocks the slot's receipt."""
    from kernelslot.store.receipts import passing_slots
    from kernelslot.verify.interpreted import EVIDENCE

    db = tmp_path / "s.db"
    store = ResultStore(db)

    def run(bundle_hash: str, *evidence_status: tuple[str, str]) -> None:
        rid = store.start_run("kernelslot verify", "cpu", "worker", "b", bundle_hash)
        results = [ProfileResult("norm.rmsnorm", "decode_batch", "float32", "generic", 3, "k", evidence=e) for e, _ in evidence_status]
        for r, (_, status) in zip(results, evidence_status):
            r.record("compare", status)
        store.add_report(rid, SlotReport("norm.rmsnorm", "k", "worker", "cpu", results))
        store.finish_run(rid, "pass")

    run("interp", (EVIDENCE, "pass"))
    run("device", ("", "pass"))
    run("mixed", ("", "pass"), (EVIDENCE, "fail"))
    assert [r["evidence"] for r in store.results(1)] == [EVIDENCE]
    assert payload_from_store(store, 1)["verdict"] == f"pass ({EVIDENCE})"
    store.close()
    assert passing_slots(db, "interp") == set() and passing_slots(db, "device") == {"norm.rmsnorm"}
    assert passing_slots(db, "mixed") == set()
