"""Direct-artifact tests build into private seal roots outside /tmp (the sandboxed worker gets a
private /tmp, so a seal must live where it can read it), removed at the end of the session."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(scope="session")
def seal_base():
    base = Path.home() / ".cache" / "kernelslot" / f"test-seals-{uuid.uuid4().hex[:12]}"
    yield base
    for p in base.rglob("*") if base.exists() else ():
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fresh_seal_root(seal_base, monkeypatch) -> Path:
    """A new, empty seal root in force for one test (``$KERNELSLOT_SEAL_DIR``)."""
    root = seal_base / uuid.uuid4().hex[:8]
    monkeypatch.setenv("KERNELSLOT_SEAL_DIR", str(root))
    return root


@pytest.fixture(scope="session")
def activation_bundle(seal_base):
    """examples/direct_activation, built and sealed once per session."""
    from kernelslot.bundle import load_bundle

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELSLOT_SEAL_DIR", str(seal_base / "shared"))
        return load_bundle(EXAMPLES / "direct_activation")
