"""Bundle identity: a SHA-256 over the bundle's files.

Files are taken in sorted order of their POSIX relative paths; for each, the hash absorbs the
8-byte little-endian length of the UTF-8 path, the path, the 8-byte length of the content and
the content. ``__pycache__`` directories and ``*.pyc`` files are excluded (importing a bundle
creates them).
"""
from __future__ import annotations

import hashlib
from pathlib import Path


def bundle_files(root: Path) -> list[Path]:
    return sorted(
        (p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"),
        key=lambda p: p.relative_to(root).as_posix(),
    )


def bundle_hash(root: str | Path) -> str:
    root = Path(root)
    h = hashlib.sha256()
    for p in bundle_files(root):
        rel = p.relative_to(root).as_posix().encode()
        data = p.read_bytes()
        h.update(len(rel).to_bytes(8, "little"))
        h.update(rel)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()
