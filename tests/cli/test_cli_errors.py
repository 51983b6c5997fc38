"""Bad input never loses work: every error path is one line on stderr, status 2, no traceback,
and nothing runs (or is written) before the inputs are validated."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelslot import __version__
from kernelslot.cli import main

ROOT = Path(__file__).resolve().parents[2]
HONEST = ROOT / "examples" / "honest_activation"
SILU_SOURCE = "def entry(x, out):\n    d = x.shape[-1] // 2\n    out.copy_(x[..., :d] * 0)\n"


def one_line_error(capsys, argv: list[str], fragment: str) -> str:
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 2, out.out + out.err
    assert "Traceback" not in out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelslot: error: "), out.err
    assert fragment in lines[0], lines[0]
    assert "verifying" not in out.err and "PASS" not in out.out  # nothing ran
    return lines[0]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kernelslot {__version__}"
    with pytest.raises(SystemExit) as exc:  # also inside a longer command line, via argparse
        main(["--version", "slots"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"kernelslot {__version__}"


def test_python_dash_m_is_the_command():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "kernelslot", "--version"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == f"kernelslot {__version__}", res.stderr


@pytest.mark.parametrize("flag", ["--json", "--html", "--store"])
def test_output_in_missing_directory(tmp_path, capsys, flag):
    target = tmp_path / "nope" / "out.file"
    one_line_error(capsys, ["verify", str(HONEST), flag, str(target)], "does not exist")
    assert not (tmp_path / "nope").exists()  # --store never creates directories


@pytest.mark.parametrize("flag", ["--json", "--html", "--store"])
def test_output_not_writable(capsys, flag):
    # /proc refuses new files even for root, so this holds whoever runs the tests
    one_line_error(capsys, ["verify", str(HONEST), flag, "/proc/kernelslot-out.file"], "/proc/kernelslot-out.file")


def test_output_is_a_directory(tmp_path, capsys):
    one_line_error(capsys, ["verify", str(HONEST), "--json", str(tmp_path)], "is a directory")


def test_store_not_sqlite(tmp_path, capsys):
    bad = tmp_path / "notes.db"
    bad.write_text("these are my notes\n")
    one_line_error(capsys, ["verify", str(HONEST), "--store", str(bad)], "not a SQLite database")
    assert bad.read_text() == "these are my notes\n"  # untouched


def test_store_sqlite_but_not_kernelslot(tmp_path, capsys):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE accounts (id INTEGER)")
    one_line_error(capsys, ["verify", str(HONEST), "--store", str(other)], "not a kernelslot store")


def test_unknown_profile_lists_valid_names(capsys):
    line = one_line_error(capsys, ["verify", "--slot", "activation.silu_and_mul", "--profile", "nope"], "--profile nope")
    assert "valid: " in line and "single_token" in line and "decode_batch" in line


def test_unknown_slot_lists_valid_names(capsys):
    line = one_line_error(capsys, ["verify", "--slot", "activation.gelu"], "--slot activation.gelu")
    assert "valid: " in line and "moe.fused_experts" in line


def test_unknown_slot_for_a_bundle(capsys):
    line = one_line_error(capsys, ["verify", str(HONEST), "--slot", "norm.rmsnorm"], "--slot norm.rmsnorm")
    assert "valid: activation.silu_and_mul" in line


def _bundle(tmp_path: Path, head: str = 'bundle_id = "b"\n', source: bytes | None = None) -> Path:
    (tmp_path / "manifest.toml").write_text(head + textwrap.dedent("""\
        abi_version = "cacheon-op-abi-v0"
        [[ops]]
        slot = "activation.silu_and_mul"
        source = "k.py"
        entry = "entry"
        """))
    (tmp_path / "k.py").write_bytes(source if source is not None else SILU_SOURCE.encode())
    return tmp_path


def test_bundle_id_of_wrong_type_says_so(tmp_path, capsys):
    one_line_error(capsys, ["scan", str(_bundle(tmp_path, "bundle_id = 42\n"))], "bundle_id: must be a string, got 42")


def test_bundle_id_missing_says_missing(tmp_path, capsys):
    one_line_error(capsys, ["scan", str(_bundle(tmp_path, ""))], "bundle_id: required key is missing")


def test_bundle_id_empty_says_empty(tmp_path, capsys):
    one_line_error(capsys, ["scan", str(_bundle(tmp_path, 'bundle_id = ""\n'))], "bundle_id: must not be empty")


def test_non_utf8_manifest(tmp_path, capsys):
    b = _bundle(tmp_path)
    (b / "manifest.toml").write_bytes(b'bundle_id = "caf\xe9"\n' + (b / "manifest.toml").read_bytes()[15:])
    one_line_error(capsys, ["verify", str(b)], "not UTF-8")


def test_non_utf8_source(tmp_path, capsys):
    b = _bundle(tmp_path, source=b"# caf\xe9\n" + SILU_SOURCE.encode())
    one_line_error(capsys, ["verify", str(b)], "k.py is not UTF-8")


def test_report_of_missing_or_foreign_files(tmp_path, capsys):
    one_line_error(capsys, ["report", str(tmp_path / "none.json"), "-o", str(tmp_path / "p.html")], "no such file")
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    one_line_error(capsys, ["report", str(junk), "-o", str(tmp_path / "p.html")], "not a kernelslot JSON report")
    one_line_error(capsys, ["report", str(junk), "--compare", "1", "2"], "--compare needs a store")
    one_line_error(capsys, ["report", "--store", str(tmp_path / "none.db")], "no such file")
    one_line_error(capsys, ["report", str(junk), "-o", str(tmp_path / "missing" / "p.html")], "does not exist")
    assert not (tmp_path / "p.html").exists()


def test_new_refuses_unknown_slot_model_and_nonempty_dir(tmp_path, capsys):
    one_line_error(capsys, ["new", "activation.gelu", str(tmp_path / "b")], "valid: ")
    one_line_error(capsys, ["new", "moe.fused_experts", str(tmp_path / "b"), "--model", "llama"], "valid: MiniMax-M3")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.py").write_text("x = 1\n")
    one_line_error(capsys, ["new", "norm.rmsnorm", str(tmp_path / "full")], "not empty")
    assert (tmp_path / "full" / "mine.py").read_text() == "x = 1\n"


def test_slots_unknown_name(capsys):
    one_line_error(capsys, ["slots", "moe.nope"], "unknown slot 'moe.nope'")
