"""Bundle bytes on the wire: a deterministic archive of a bundle directory, and its safe unpacking.

A submission is a tar (optionally gzip-compressed) or zip archive of one bundle: its files at the
archive's root, or all under one top-level directory. :func:`pack` writes the canonical form (a
gzip tar, members sorted, owner, mode and mtime normalised, ``__pycache__`` left out) so packing
the same directory twice gives the same bytes. :func:`unpack` refuses what a bundle never holds
(links, devices, absolute or ``..`` paths) and anything over the limits, with a one-line reason.

A submission's key is the bundle's content hash (:func:`kernelslot.bundle.hashing.bundle_hash` of
the unpacked tree, the same id ``kernelslot verify`` prints), so two archives of the same files
are one bundle whatever their container's metadata.
"""
from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kernelslot.bundle.hashing import bundle_files

__all__ = ["Limits", "ArchiveError", "pack", "unpack"]


@dataclass(frozen=True)
class Limits:
    """What one submission may hold."""
    archive_bytes: int = 16 << 20  # the archive as sent
    unpacked_bytes: int = 64 << 20  # its files together
    files: int = 2000


class ArchiveError(ValueError):
    """The bytes are not a bundle archive this service accepts (one line: what, and how to fix)."""


def pack(root: str | Path) -> bytes:
    """The canonical archive of the bundle directory ``root`` (a gzip tar of its files, sorted)."""
    root = Path(root)
    if not (root / "manifest.toml").is_file():
        raise ArchiveError(f"{root}: not a bundle directory (no manifest.toml)")
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in bundle_files(root):
            data = p.read_bytes()
            info = tarfile.TarInfo(p.relative_to(root).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _member_path(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ArchiveError(f"archive member {name!r}: absolute or parent-relative paths are not allowed")
    return path


def _members(data: bytes, limits: Limits) -> list[tuple[PurePosixPath, bytes]]:
    out: list[tuple[PurePosixPath, bytes]] = []
    total = 0

    def add(name: str, read) -> None:
        nonlocal total
        if len(out) >= limits.files:
            raise ArchiveError(f"more than {limits.files} files in the archive")
        path = _member_path(name)
        blob = read()
        total += len(blob)
        if total > limits.unpacked_bytes:
            raise ArchiveError(f"unpacked size over the limit of {limits.unpacked_bytes >> 20} MiB")
        out.append((path, blob))

    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                for info in zf.infolist():
                    if info.is_dir():
                        continue
                    if (info.external_attr >> 16) & 0o170000 not in (0, 0o100000):
                        raise ArchiveError(f"archive member {info.filename!r}: only regular files are allowed")
                    if info.file_size > limits.unpacked_bytes:
                        raise ArchiveError(f"unpacked size over the limit of {limits.unpacked_bytes >> 20} MiB")
                    add(info.filename, lambda i=info: zf.read(i))
        except (zipfile.BadZipFile, EOFError) as exc:
            raise ArchiveError(f"not a readable zip archive ({exc})") from None
        return out
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for m in tar:
                if m.isdir():
                    continue
                if not m.isfile():
                    raise ArchiveError(f"archive member {m.name!r}: only regular files are allowed (links and devices are not)")
                if m.size > limits.unpacked_bytes:
                    raise ArchiveError(f"unpacked size over the limit of {limits.unpacked_bytes >> 20} MiB")
                add(m.name, lambda m=m: tar.extractfile(m).read())
    except tarfile.ReadError:
        raise ArchiveError("not a bundle archive (send a tar, tar.gz or zip of a bundle directory; "
                           "kernelslot submit DIR packs one)") from None
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise ArchiveError(f"a damaged archive ({exc})") from None
    return out


def unpack(data: bytes, dest: str | Path, limits: Limits = Limits()) -> Path:
    """Unpack the archive ``data`` under the empty directory ``dest``; return the bundle's root (the
    directory holding manifest.toml). Raise :class:`ArchiveError` with the reason if it is refused."""
    if len(data) > limits.archive_bytes:
        raise ArchiveError(f"archive of {len(data)} bytes is over the limit of {limits.archive_bytes >> 20} MiB")
    if not data:
        raise ArchiveError("empty submission (send a tar, tar.gz or zip of a bundle directory)")
    members = _members(data, limits)
    if not members:
        raise ArchiveError("the archive holds no files")
    tops = {p.parts[0] for p, _ in members}
    strip = 1 if len(tops) == 1 and all(len(p.parts) > 1 for p, _ in members) else 0
    dest = Path(dest)
    for path, blob in members:
        rel = PurePosixPath(*path.parts[strip:])
        target = dest.joinpath(*rel.parts)
        if "__pycache__" in rel.parts or rel.suffix == ".pyc":
            continue
        if target.exists():
            raise ArchiveError(f"archive member {str(path)!r} appears twice")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob)
    if not (dest / "manifest.toml").is_file():
        raise ArchiveError("the archive holds no manifest.toml at its root or under one top-level directory")
    return dest
