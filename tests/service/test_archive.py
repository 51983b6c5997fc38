"""Bundle archives: canonical packing and the refusals of unpacking."""
from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from kernelslot.bundle.hashing import bundle_hash
from kernelslot.service.archive import ArchiveError, Limits, pack, unpack

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "honest_norm"


def _tar(members: list[tuple[str, bytes]], **kinds) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in kinds.get("links", []):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def test_packing_is_canonical_and_the_hash_is_the_bundles(tmp_path):
    a, b = pack(EXAMPLE), pack(EXAMPLE)
    assert a == b
    root = unpack(a, tmp_path / "x")
    assert bundle_hash(root) == bundle_hash(EXAMPLE)


def test_one_top_level_directory_is_stripped_and_zip_is_accepted(tmp_path):
    files = [(p.relative_to(EXAMPLE).as_posix(), p.read_bytes()) for p in EXAMPLE.rglob("*") if p.is_file()
             and "__pycache__" not in p.parts]
    nested = unpack(_tar([(f"honest_norm/{n}", d) for n, d in files]), tmp_path / "a")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, d in files:
            zf.writestr(n, d)
    zipped = unpack(buf.getvalue(), tmp_path / "b")
    assert bundle_hash(nested) == bundle_hash(zipped) == bundle_hash(EXAMPLE)


@pytest.mark.parametrize("data, reason", [
    (b"", "empty submission"),
    (b"this is not an archive", "not a bundle archive"),
    (_tar([("../evil.py", b"x"), ("manifest.toml", b"")]), "parent-relative"),
    (_tar([("/abs.py", b"x")]), "absolute"),
    (_tar([("manifest.toml", b"")], links=[("k.py", "/etc/passwd")]), "only regular files"),
    (_tar([("a/x.py", b"x")]), "no manifest.toml"),
])
def test_what_is_refused(tmp_path, data, reason):
    with pytest.raises(ArchiveError, match=reason):
        unpack(data, tmp_path / "x")


def test_limits(tmp_path):
    data = pack(EXAMPLE)
    with pytest.raises(ArchiveError, match="over the limit"):
        unpack(data, tmp_path / "a", Limits(archive_bytes=len(data) - 1))
    with pytest.raises(ArchiveError, match="unpacked size over"):
        unpack(data, tmp_path / "b", Limits(unpacked_bytes=100))
    with pytest.raises(ArchiveError, match="more than 1 files"):
        unpack(data, tmp_path / "c", Limits(files=1))
