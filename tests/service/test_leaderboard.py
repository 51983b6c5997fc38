"""The leaderboard page: ranking, spreads, devices, counts, history and report links."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernelslot.cli import main
from kernelslot.service.archive import pack
from kernelslot.service.leaderboard import render_leaderboard
from kernelslot.service.service import Service

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _row(variant: str, speedup: float | None, status: str = "pass") -> dict:
    return {"slot": "norm.rmsnorm", "variant": variant, "status": status, "speedup": speedup,
            "speedup_lo": None if speedup is None else speedup * 0.9, "speedup_hi": None if speedup is None else speedup * 1.1,
            "timed": 0 if speedup is None else 6, "device": "Test CPU, AVX2"}


def _filled(path: Path) -> Service:
    svc = Service(str(path))
    runs = [("honest_norm", "alice", "pass", [_row("slow", 0.8)]), ("honest_activation", "bob", "pass", [_row("fast", 1.7)]),
            ("honest_override", "carol", "pass", [_row("untimed", None)]),
            ("broken_partial_write", "mallory", "fail", [_row("broken", None, "fail")])]
    for example, who, status, rows in runs:
        sid = svc.admit(pack(EXAMPLES / example), who)["id"]
        aid, _ = svc.store.start_attempt(sid, "cpu:test:1", "node")
        svc.store.record_verdict(sid, aid, {"status": status, "exit_code": 0 if status == "pass" else 1, "reason": f"r{sid}",
                                            "device": "Test CPU", "elapsed": 1.0, "payload": "{}",
                                            "report_html": f"<html>report {sid}</html>"}, rows)
    svc.admit(pack(EXAMPLES / "honest_activation"), "copycat")
    svc.admit(pack(EXAMPLES / "broken_partial_write"), "mallory")
    svc.admit(b"junk", "eve")
    return svc


def test_variants_are_ranked_by_speedup_with_spread_device_and_copies(tmp_path):
    svc = _filled(tmp_path / "s.db")
    page = render_leaderboard(svc.store)
    svc.store.close()
    board = re.search(r"<table class='board' data-slot='norm.rmsnorm'>(.*?)</table>", page).group(1)
    assert re.findall(r"<tr><td class='n'>\d+</td><td>(\w+)</td>", board) == ["fast", "slow", "untimed"]
    assert "x1.70" in board and "x1.53 – x1.87" in board and "Test CPU, AVX2" in board
    fast = re.search(r"<tr><td class='n'>1</td>.*?</tr>", board).group(0)
    assert re.search(r"<td class='n'>1</td><td><a href='/reports/2.html'>#2</a>", fast)  # one copy, credited to bob's #2
    assert "verdicts: 3 pass, 1 fail, 0 not run" in page
    assert "7 submissions: 3 passed, 1 failed, 0 not run, 1 invalid; 1 copies of a pass, 1 duplicates" in page
    history = re.search(r"<table id='history'>(.*?)</table>", page).group(1)
    assert history.count("<tr>") == 8 and "copy_of:2" in history and "duplicate_of:4:r4" in history
    assert "1: done on cpu:test:1" in history


def test_the_command_writes_the_page_and_its_reports(tmp_path, capsys):
    _filled(tmp_path / "s.db").store.close()
    out = tmp_path / "board.html"
    assert main(["leaderboard", "--store", str(tmp_path / "s.db"), "--html", str(out)]) == 0
    page = out.read_text()
    assert "board-reports/2.html" in page and (tmp_path / "board-reports" / "2.html").read_text() == "<html>report 2</html>"
    assert main(["leaderboard", "--store", str(tmp_path / "none.db"), "--html", str(out)]) == 2
    assert "no such store" in capsys.readouterr().err


def test_submit_needs_a_service_or_local(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KERNELSLOT_SERVICE", raising=False)
    assert main(["submit", str(EXAMPLES / "honest_norm")]) == 2
    assert "give --service URL" in capsys.readouterr().err
    assert main(["submit", str(tmp_path / "missing"), "--local"]) == 2
    assert "no such bundle directory or archive" in capsys.readouterr().err


def _browser() -> str | None:
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.slow
@pytest.mark.skipif(_browser() is None, reason="no headless browser installed (apt-get install -y chromium)")
def test_a_real_browser_renders_the_leaderboard(tmp_path):
    _filled(tmp_path / "s.db").store.close()
    out = tmp_path / "board.html"
    assert main(["leaderboard", "--store", str(tmp_path / "s.db"), "--html", str(out)]) == 0
    cmd = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(cmd + ["--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and "data-slot=\"norm.rmsnorm\"" in dom.stdout, dom.stderr[-2000:]
    shot = tmp_path / "page.png"
    res = subprocess.run(cmd + [f"--screenshot={shot}", "--window-size=1280,900", out.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    _assert_table_drawn(shot)


def _assert_table_drawn(png: Path) -> None:
    """The screenshot holds the table: rows of grey cell borders (#ccc) and header shading (#f2f2f2)."""
    import zlib

    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, pos = {}, 8
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        chunks.setdefault(kind, []).append(data[pos + 8:pos + 8 + n])
        pos += 12 + n
    ihdr = chunks[b"IHDR"][0]
    width, height, depth, colour = int.from_bytes(ihdr[:4], "big"), int.from_bytes(ihdr[4:8], "big"), ihdr[8], ihdr[9]
    assert depth == 8 and colour in (2, 6), (depth, colour)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    stride, rows, prev = width * bpp, [], bytearray(width * bpp)
    for y in range(height):  # undo the PNG row filters
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    header = sum(1 for r in rows for x in range(0, stride, bpp) if r[x:x + 3] == b"\xf2\xf2\xf2")
    border_rows = sum(1 for r in rows if sum(1 for x in range(0, stride, bpp) if r[x:x + 3] == b"\xcc\xcc\xcc") > width // 4)
    assert header > 2000, f"no table header shading in the screenshot ({header} px)"
    assert border_rows >= 4, f"no table rows drawn in the screenshot ({border_rows} border lines)"
