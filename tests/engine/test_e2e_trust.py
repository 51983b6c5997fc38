"""``kernelslot e2e`` judges from outside the candidate's reach (issue 25, part 2).

The cheats act at import: they rewrite the e2e gate, the receipts, the comparators and the
router's audit, then compute a wrong answer (each token's lightest expert dropped). e2e runs the
referee with the candidate in its worker and serves the bundle from the sandboxed executor, so
the bundle's code never enters this process: every verdict fails, and everything the cheats
patched is untouched here afterwards.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from kernelslot.cli import main

CHEATS = Path(__file__).resolve().parents[1] / "cheats"
SMALL = ["--model", "qwen3-moe", "--prompts", "2", "--prompt-len", "4", "--steps", "3"]
MANIFEST = """bundle_id = "e2e-cheat-{name}"
abi_version = "cacheon-op-abi-v0"

[[ops]]
slot = "moe.fused_experts"
variant = "silu"
source = "cheat.py"
entry = "entry"
prepare = "prepare"
dtypes = ["float32"]
[ops.domain]
model = {{ exact = "generic" }}
quant = {{ exact = "dense" }}
"""


def _bundle(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    shutil.copy(CHEATS / f"{name}.py", root / "cheat.py")
    shutil.copy(CHEATS / "_drops_lightest_expert.py", root)  # the wrong kernel both cheats serve
    (root / "manifest.toml").write_text(MANIFEST.format(name=name.replace("_", "-")))
    return root


def _judge_state() -> dict:
    """What the cheats patch, as this (the judge's) process holds it."""
    import kernelslot.abi.comparators as comparators
    import kernelslot.engines.e2e as e2e
    import kernelslot.store.receipts as receipts
    from kernelslot.dispatch.router import SlotRouter

    compare = {n: getattr(c, "compare") for n in dir(comparators)
               if isinstance(c := getattr(comparators, n), type) and hasattr(c, "compare")}
    return {"gate": repr(e2e.GATE), "kl_stats": e2e.kl_stats, "flips": e2e._flips,
            "qualified_counters": e2e._qualified_counters, "passing_slots": receipts.passing_slots,
            "verified_envelopes": receipts.verified_envelopes, "audit": SlotRouter._audit, "compare": compare}


def _imported_from(root: Path) -> list[str]:
    return [n for n, m in list(sys.modules.items()) if str(root) in str(getattr(m, "__file__", "") or "")]


@pytest.mark.parametrize("name", ["e2e_rewrites_gate", "e2e_patches_receipts"])
def test_a_bundle_that_patches_the_judge_at_import_fails_e2e_and_patches_nothing_here(name, tmp_path, capsys):
    bundle = _bundle(tmp_path, name)
    before = _judge_state()
    # installed without the referee, so that the e2e gate and the serving audits are what judge it
    rc = main(["e2e", str(bundle), *SMALL, "--skip-referee", "--store", str(tmp_path / "r.sqlite")])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "FAIL" in out and ("audit against the incumbent failed" in out or "mean KL" in out), out
    assert _judge_state() == before
    assert _imported_from(bundle) == []


@pytest.mark.slow
def test_patched_receipts_buy_no_installation_the_referee_rejects_it(tmp_path, capsys):
    bundle = _bundle(tmp_path, "e2e_patches_receipts")
    before = _judge_state()
    rc = main(["e2e", str(bundle), *SMALL, "--store", str(tmp_path / "r.sqlite")])
    out = capsys.readouterr().out
    assert rc == 1 and "the slot referee rejected moe.fused_experts" in out, out
    assert _judge_state() == before and _imported_from(bundle) == []


def test_the_same_bundle_imported_in_process_would_be_qualified(tmp_path):
    """What the sandbox buys: opted in-process (never done by the CLI), the gate cheat rewrites the
    gate of the process that judges it and is qualified although it drops an expert per token.
    In a child process, so that its patches die with it."""
    import subprocess

    bundle = _bundle(tmp_path, "e2e_rewrites_gate")
    code = ("import warnings; warnings.simplefilter('ignore')\n"
            "from kernelslot.engines.e2e import run_e2e\n"
            f"r = run_e2e('qwen3-moe', bundle={str(bundle)!r}, trust_unverified=True, trust='in-process', "
            "prompts=2, prompt_len=4, steps=3)\n"
            "print('PASSED' if r.passed else 'FAILED', r.reasons)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "PASSED" in done.stdout, done.stdout
