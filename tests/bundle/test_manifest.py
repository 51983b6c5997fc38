"""Manifest parsing: every malformed field is a one-line error naming file and key."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelslot.bundle import ManifestError, bundle_hash, load_bundle, load_manifest

GOOD_OP = """
[[ops]]
slot = "activation.silu_and_mul"
source = "k.py"
entry = "entry"
"""
HEAD = 'bundle_id = "b"\nabi_version = "cacheon-op-abi-v0"\n'


def make(tmp_path: Path, body: str, source: str = "def entry(x, out):\n    out.zero_()\n") -> Path:
    (tmp_path / "manifest.toml").write_text(textwrap.dedent(body))
    (tmp_path / "k.py").write_text(source)
    return tmp_path


@pytest.mark.parametrize(
    "body, key, fragment",
    [
        ("abi_version = 'cacheon-op-abi-v0'\n" + GOOD_OP, "bundle_id", "required"),
        ('bundle_id = "b"\nabi_version = "v9"\n' + GOOD_OP, "abi_version", "allowed: 'cacheon-op-abi-v0'"),
        (HEAD + "colour = 1\n" + GOOD_OP, "colour", "unknown top-level key"),
        (HEAD, "ops", "at least one"),
        (HEAD + GOOD_OP.replace('entry = "entry"', 'entry = "entry"\nfoo = 1'), "ops[0].foo", "allowed:"),
        (HEAD + GOOD_OP.replace('"k.py"', '"/etc/passwd"'), "ops[0].source", "leaves the bundle"),
        (HEAD + GOOD_OP.replace('"k.py"', '"missing.py"'), "ops[0].source", "does not exist"),
        (HEAD + GOOD_OP + 'dtypes = ["float64"]\n', "ops[0].dtypes", "allowed: float32"),
        (HEAD + GOOD_OP + 'graph_safe = "yes"\n', "ops[0].graph_safe", "true or false"),
        (HEAD + GOOD_OP + 'prepare = "p"\n', "ops[0].prepare", "no prepare step"),
        (HEAD + GOOD_OP + "[ops.domain]\nnum_tokens = { range = [8, 1] }\n", "ops[0].domain", "lo <= hi"),
        (HEAD + GOOD_OP + "[ops.domain]\nflavour = { exact = 1 }\n", "ops[0].domain", "unknown descriptor field"),
        (HEAD + GOOD_OP + GOOD_OP, "ops[0].variant", "every row needs a variant"),
        (HEAD + "[competition]\nprize = 'x'\n" + GOOD_OP, "competition.prize", "allowed: target, mode"),
        (HEAD + GOOD_OP + 'metadata = "meta.json"\n', "ops[0].metadata", "does not exist"),
        ("bundle_id = [", "", "not valid TOML"),
    ],
)
def test_malformed_manifest_names_file_and_key(tmp_path, body, key, fragment):
    make(tmp_path, body)
    with pytest.raises(ManifestError) as exc:
        load_manifest(tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg
    assert str(tmp_path / "manifest.toml") in msg
    assert f": {key}:" in msg or not key
    assert fragment in msg


def test_metadata_model_selects_profile(tmp_path):
    make(tmp_path, HEAD + GOOD_OP + 'metadata = "meta.json"\n')
    (tmp_path / "meta.json").write_text('{"model": "MiniMax-M3"}')
    assert load_manifest(tmp_path).ops[0].model == "MiniMax-M3"
    (tmp_path / "meta.json").write_text('{"model": "llama"}')
    with pytest.raises(ManifestError, match="model 'llama'"):
        load_manifest(tmp_path)


def test_static_check_rejects_referee_import(tmp_path):
    make(tmp_path, HEAD + GOOD_OP, "import kernelslot.verify\ndef entry(x, out):\n    pass\n")
    with pytest.raises(ManifestError, match="imports the referee"):
        load_bundle(tmp_path)


def test_bundle_hash_is_content_and_path_sensitive(tmp_path):
    make(tmp_path, HEAD + GOOD_OP)
    h0 = bundle_hash(tmp_path)
    assert h0 == bundle_hash(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "k.cpython-311.pyc").write_bytes(b"junk")
    assert bundle_hash(tmp_path) == h0
    (tmp_path / "k.py").write_text("def entry(x, out):\n    out.zero_() \n")
    h1 = bundle_hash(tmp_path)
    assert h1 != h0
    (tmp_path / "k.py").rename(tmp_path / "k2.py")
    assert bundle_hash(tmp_path) != h1
