"""`kernelslot new SLOT DIR` writes a bundle that passes `kernelslot verify` as written."""
from __future__ import annotations

import json

import pytest

from kernelslot.abi import SlotKind
from kernelslot.cli import main
from kernelslot.slots import CATALOG

SINGLE_DEVICE = sorted(n for n, d in CATALOG.items() if d.slot.kind is not SlotKind.COLLECTIVE)


def _new(tmp_path, capsys, slot: str, *extra: str):
    target = tmp_path / slot.replace(".", "_")
    assert main(["new", slot, str(target), *extra]) == 0
    capsys.readouterr()
    return target


def _verify(capsys, bundle, *extra: str) -> tuple[int, str]:
    rc = main(["verify", str(bundle), "--quiet", "--envelope-field", "num_tokens", *extra])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_every_single_device_slot_has_a_template_that_passes(tmp_path, capsys):
    """Fast form: scan, then one profile per slot in-process (the slow test runs everything isolated)."""
    for slot in SINGLE_DEVICE:
        b = _new(tmp_path, capsys, slot)
        manifest = (b / "manifest.toml").read_text()
        assert manifest.startswith("# ") and f'slot = "{slot}"' in manifest
        source = next(p for p in b.glob("*.py"))
        assert "What to change" in source.read_text() and "kernelslot.verify" not in source.read_text()
        assert main(["scan", str(b)]) == 0, capsys.readouterr()
        profile = CATALOG[slot].profiles[0].name
        rc, text = _verify(capsys, b, "--in-process", "--dtype", "float32", "--profile", profile, "--replays", "2")
        assert rc == 0 and "PASS: 1/1 slots passed" in text, (slot, text)


def test_fused_experts_template_covers_minimax_dense_and_nvfp4(tmp_path, capsys):
    b = _new(tmp_path, capsys, "moe.fused_experts", "--model", "MiniMax-M3")
    assert json.loads((b / "metadata.json").read_text()) == {"model": "MiniMax-M3"}
    src = (b / "fused_experts.py").read_text()
    assert "'alpha': 1.702" in src and "'up_clamp': (-7.0, 7.0)" in src
    for profile in ("minimax_nvfp4", "minimax_swigluoai_clamped"):
        rc, text = _verify(capsys, b, "--in-process", "--dtype", "float32", "--profile", profile, "--replays", "2")
        assert rc == 0, (profile, text)


@pytest.mark.slow
@pytest.mark.parametrize("slot", SINGLE_DEVICE)
def test_template_passes_the_full_isolated_verify(tmp_path, capsys, slot):
    b = _new(tmp_path, capsys, slot)
    rc, text = _verify(capsys, b)
    assert rc == 0 and "PASS: 1/1 slots passed" in text, text


@pytest.mark.parametrize("slot, example, model", [
    ("moe.fused_experts", "honest_moe_fused_experts", "MiniMax-M3"), ("moe.block_tkg", "honest_moe_block_tkg", None)])
def test_the_moe_examples_are_the_templates(tmp_path, capsys, slot, example, model):
    """examples/honest_moe_* are what `kernelslot new` writes (regenerate them when a template changes)."""
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples" / example
    b = _new(tmp_path, capsys, slot, *(["--model", model] if model else []))
    for f in b.iterdir():
        if f.name != "manifest.toml":
            assert (ex / f.name).read_text() == f.read_text(), f"regenerate examples/{example}/{f.name}"
