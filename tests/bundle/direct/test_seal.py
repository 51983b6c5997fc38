"""Build and seal: the index, reuse while unchanged, and every change after sealing rejected."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernelslot.bundle import load_bundle
from kernelslot.bundle.direct import SealError, build_and_seal, open_seal
from kernelslot.bundle.direct.seal import C_FLAGS, INDEX, LINK_FLAGS
from kernelslot.cli import main
from kernelslot.slots import get_slot
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.isolation.worker import WorkerRunner

from .conftest import EXAMPLES


def _seal(bundle):
    return next(iter(bundle.seals.values()))


def test_index_lists_every_file_with_flags_and_toolchain(activation_bundle):
    seal = _seal(activation_bundle)
    idx = seal.index
    assert {f["path"] for f in idx["files"]} == {"artifact.so", "sources/src/silu_and_mul.c", "sources/src/dtypes.h"}
    assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in idx["files"])
    assert idx["flags"] == C_FLAGS + LINK_FLAGS and idx["toolchain"]["gcc"].startswith("gcc")
    assert idx["declaration_digest"] == activation_bundle.manifest.ops[0].direct.digest
    assert [k["name"] for k in idx["inventory"]] == ["ks_silu_and_mul_bf16", "ks_silu_and_mul_f16", "ks_silu_and_mul_f32"]
    assert seal.handle.endswith("@" + seal.digest)


def test_an_unchanged_row_is_built_once(activation_bundle, monkeypatch):
    seal = _seal(activation_bundle)
    monkeypatch.setenv("KERNELSLOT_SEAL_DIR", str(seal.path.parent))
    stamp = (seal.path / "artifact.so").stat().st_mtime_ns
    again = build_and_seal(activation_bundle.manifest.ops[0].direct, activation_bundle.manifest.root)
    assert again.path == seal.path and again.digest == seal.digest
    assert (seal.path / "artifact.so").stat().st_mtime_ns == stamp


def _copy(seal, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(seal.path, dest)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def test_every_change_after_sealing_is_rejected(activation_bundle, tmp_path):
    seal = _seal(activation_bundle)
    assert open_seal(seal.path, seal.digest).artifact == seal.artifact
    cases = {
        "artifact.so changed after sealing": lambda d: (d / "artifact.so").write_bytes((d / "artifact.so").read_bytes()[:-1] + b"\x01"),
        "was added after sealing": lambda d: (d / "extra.so").write_bytes(b"x"),
        "sealed file sources/src/dtypes.h is missing": lambda d: (d / "sources/src/dtypes.h").unlink(),
        "index.json changed after sealing": lambda d: (d / INDEX).write_text(json.dumps({**json.loads((d / INDEX).read_text()), "flags": []})),
    }
    for i, (reason, tamper) in enumerate(cases.items()):
        d = _copy(seal, tmp_path / str(i))
        tamper(d)
        with pytest.raises(SealError, match=reason):
            open_seal(d, seal.digest)


def test_tampering_is_caught_by_the_worker_and_by_the_cli(fresh_seal_root, capsys):
    bundle = load_bundle(EXAMPLES / "direct_activation")
    seal = _seal(bundle)
    artifact = seal.path / "artifact.so"
    artifact.chmod(0o644)
    artifact.write_bytes(artifact.read_bytes().replace(b"ks_silu_and_mul_f32", b"ks_silu_and_mul_f33", 1))
    # after the referee sealed it, before the worker loads it: the worker re-verifies and refuses
    with WorkerRunner(call_timeout_s=60) as runner:
        report = verify_slot(get_slot("activation.silu_and_mul"), bundle.candidates()["activation.silu_and_mul"],
                             VerifyOptions(profiles=("single_token",), dtypes=(__import__("torch").float32,)), runner=runner)
    assert not report.passed
    text = " ".join(c.message for r in report.results for c in r.failures())
    assert "artifact.so changed after sealing" in text and "load_failed" in text
    # and the next referee run rejects the bundle as bad input, on one line
    rc = main(["verify", str(EXAMPLES / "direct_activation"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "artifact.so changed after sealing" in err
    assert len([ln for ln in err.strip().splitlines() if not ln.startswith("kernelslot: seeds")]) == 1
