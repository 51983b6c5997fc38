"""Direct-artifact tests build into private seal roots outside /tmp (the sandboxed worker gets a
private /tmp, so a seal must live where it can read it), removed at the end of the session."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(scope="session")
def private_seal_root():
    """A factory of fresh seal roots; each call sets ``$KERNELSLOT_SEAL_DIR`` to a new one."""
    base = Path.home() / ".cache" / "kernelslot" / f"test-seals-{uuid.uuid4().hex[:12]}"
    old = os.environ.get("KERNELSLOT_SEAL_DIR")

    def fresh() -> Path:
        root = base / uuid.uuid4().hex[:8]
        os.environ["KERNELSLOT_SEAL_DIR"] = str(root)
        return root

    yield fresh
    if old is None:
        os.environ.pop("KERNELSLOT_SEAL_DIR", None)
    else:
        os.environ["KERNELSLOT_SEAL_DIR"] = old
    for p in base.rglob("*") if base.exists() else ():
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def activation_bundle(private_seal_root):
    """examples/direct_activation, built and sealed once per session."""
    from kernelslot.bundle import load_bundle

    private_seal_root()
    return load_bundle(EXAMPLES / "direct_activation")
