"""The native build cache is verified by content hash on every load: a changed library is rebuilt, never loaded."""
from __future__ import annotations

import shutil

import pytest

from kernelslot.kernels.native import build


@pytest.fixture
def tiny_build(tmp_path, monkeypatch):
    """build on a one-function library (a real compile, seconds instead of minutes)."""
    cc = build._compiler()
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "src"
    src.mkdir()
    for name in build._SOURCES:
        (src / name).write_text("\n")
    (src / "ks_native.c").write_text("int ks_answer(void) { return 42; }\n")
    monkeypatch.setattr(build, "_SRC_DIR", src)
    monkeypatch.setattr(build, "_objects", lambda x86: [("ks_native.c", [])])
    monkeypatch.setenv("KERNELSLOT_NATIVE_CACHE", str(tmp_path / "cache"))
    return cc


def test_a_changed_library_is_rebuilt_never_loaded(tiny_build):
    data, sha = build._compile(tiny_build)
    (target,) = (p for p in build.cache_root().rglob("libks_native.so"))
    assert target.read_bytes() == data and build._verified(target) == (data, sha)
    target.write_bytes(data + b"\x90patched")  # someone edits the cached library
    assert build._verified(target) is None
    again, sha2 = build._compile(tiny_build)
    assert b"patched" not in again and target.read_bytes() == again and build._verified(target) == (again, sha2)
    lib = build._dlopen(again)
    assert lib.ks_answer() == 42


def test_a_library_without_its_record_is_not_trusted(tiny_build):
    data, _ = build._compile(tiny_build)
    (target,) = (p for p in build.cache_root().rglob("libks_native.so"))
    (target.parent / build._DIGEST).unlink()
    assert build._verified(target) is None
    shutil.copy(target, target.with_name("copy.so"))
    rebuilt, sha = build._compile(tiny_build)
    assert (target.parent / build._DIGEST).read_text().strip() == sha


def test_receipts_name_the_loaded_library():
    from kernelslot.verify.integrity import run_provenance, referee_sha256

    st = build.loaded()
    fields = run_provenance(object())
    assert fields["sandbox"] == "in-process" and fields["referee_sha256"] == referee_sha256() and len(referee_sha256()) == 64
    assert fields["native_sha256"] == (st.sha256 if st.lib is not None else None)
