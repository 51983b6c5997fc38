"""What a receipt says about the code that judged a run: the sandbox in force, how a worker's
memory is capped (a cgroup or the poll, :func:`kernelslot.isolation.cgroup.describe`), a hash of
the referee package as it is on disk, and a hash of the native library actually loaded.

``referee_sha256`` covers every file of the installed ``kernelslot`` package except byte-code
caches (relative path and contents, in sorted order), so a store can show that no run was
served by a modified referee. ``native_sha256`` is the SHA-256 of the library bytes that were
loaded (``kernels/native/build.py`` verifies them against the hash recorded at build time
before every load), or ``None`` when this run never loaded it.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__all__ = ["referee_sha256", "run_provenance"]

_PACKAGE = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def referee_sha256() -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in _PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def run_provenance(runner: object) -> dict[str, object]:
    """Plain fields for a run's receipts (report JSON, store ``extra``)."""
    from kernelslot.kernels.native import build

    from kernelslot.isolation import cgroup

    box = getattr(runner, "sandbox", None)
    memory = getattr(runner, "memory_bytes", None)
    return {"sandbox": box.mode if box is not None else "in-process",
            "sandbox_detail": box.describe() if box is not None else "no isolation: candidate code ran in the referee",
            "memory_cap": cgroup.describe(memory) if memory is not None else "none: candidate code ran in the referee",
            "numeric_state": _numeric_state(runner),
            "referee_sha256": referee_sha256(), "native_sha256": build.loaded_sha256()}


def _numeric_state(runner: object) -> str:
    """How process-wide numeric state around candidate calls was observed."""
    if not hasattr(runner, "fp_unobserved"):
        return "in-process snapshot only (candidate code ran in the referee)"
    why = getattr(runner, "fp_unobserved")
    return (f"in-worker snapshot only (not observed from outside: {why})" if why
            else "each worker's threads read from outside (ptrace: MXCSR / FPCR) and the in-worker snapshot")
