"""Every install point (engines/transformers/install_points.py): the built-in served through it
passes the fp32 e2e gate, a broken bundle served through it (sandboxed, audited) fails e2e, and a
class without a site for the slot is "not run" with the reason."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from kernelslot.engines.e2e import run_e2e, run_trace
from kernelslot.engines.e2e_matrix import NOT_RUN, PASS, run_matrix
from kernelslot.engines.transformers import NoSiteError, install
from kernelslot.engines.transformers.install_points import INSTALL_POINTS, SLOTS
from kernelslot.engines.transformers.models import build_model

from tests.engine.conftest import BUNDLES, prompts

# prompt_len 8 + 2 steps: the decode cache spans two page blocks (the broken decode drops the last one)
SMALL = dict(prompts=2, prompt_len=8, steps=2)
# (slot, a class with a site for it, the broken bundle)
POINTS = [
    ("norm.rmsnorm", "qwen3-moe", "broken_norm"),
    ("activation.silu_and_mul", "qwen3-moe", "broken_activation"),
    ("attention.sdpa", "mixtral", "broken_attention"),
    ("attention.decode", "mixtral", "broken_decode"),
    ("moe.fused_experts", "qwen3-moe", "broken_experts"),
    ("moe.block_tkg", "minimax-m3", "broken_block_tkg"),
]
_FAST_BROKEN = {"activation.silu_and_mul", "moe.block_tkg"}  # the others take 10-20 s each here (slow)
BROKEN = [pytest.param(*p, marks=() if p[0] in _FAST_BROKEN else pytest.mark.slow) for p in POINTS]


def test_every_registered_slot_has_a_test_row() -> None:
    assert sorted(s for s, _, _ in POINTS) == sorted(SLOTS) == sorted(INSTALL_POINTS)


@pytest.mark.parametrize("slot,model,_", POINTS)
def test_builtin_through_the_point_passes_fp32(slot: str, model: str, _: str) -> None:
    r = run_e2e(model, "float32", slots=(slot,), **SMALL)
    assert r.passed, r.reasons
    assert r.kl["mean"] <= 1e-8 and r.flips == 0
    assert r.counters[slot]["builtin"]["fired_decode"] > 0


@pytest.mark.parametrize("slot,model,broken", BROKEN)
def test_broken_bundle_through_the_point_fails_e2e(slot: str, model: str, broken: str) -> None:
    r = run_e2e(model, "float32", bundle=BUNDLES / broken, trust_unverified=True, slots=(slot,), **SMALL)
    assert not r.passed, f"{broken} passed e2e on {model}"


@pytest.mark.parametrize("model,slot,why", [
    ("gpt-oss", "attention.sdpa", "sinks"),
    ("gpt-oss", "activation.silu_and_mul", "swigluoai"),
    ("minimax-m3", "activation.silu_and_mul", "swigluoai"),
    ("deepseek-v3", "moe.block_tkg", "routing"),
    ("deepseek-v3", "attention.decode", "MLA"),
])
def test_a_class_without_a_site_says_why(model: str, slot: str, why: str) -> None:
    with pytest.raises(NoSiteError, match=why):
        install(build_model(model), slots=(slot,))
    cell, = run_matrix([model], [slot], **SMALL)
    assert cell.status == NOT_RUN and why in cell.reason


def test_block_tkg_serves_every_supported_class_and_uninstall_restores() -> None:
    for name in ("qwen3-moe", "minimax-m3", "gpt-oss", "olmoe"):
        m = build_model(name)
        ids = prompts(m.config.vocab_size, 2, 5)
        ref = run_trace(m, ids, 2).logits
        h = install(m, slots=("moe.block_tkg",))
        got = run_trace(m, ids, 2).logits
        assert h.counters()["moe.block_tkg"]["builtin"]["fired_decode"] > 0
        h.uninstall()
        assert float((got - ref).abs().max()) < 1e-5, name
        assert torch.equal(run_trace(m, ids, 2).logits, ref)


def test_block_descriptor_names_the_profile_whose_semantics_the_layer_has() -> None:
    want = {"qwen3-moe": "qwen3-moe", "mixtral": "qwen3-moe", "minimax-m3": "MiniMax-M3", "gpt-oss": "gpt-oss",
            "olmoe": "generic"}
    for name, profile in want.items():
        m = build_model(name)
        h = install(m, slots=("moe.block_tkg",))
        sites = {type(x).__name__: x for x in m.modules()}
        assert sites["BlockSite"].profile == profile, name
        h.uninstall()


def test_honest_example_outside_its_domain_is_not_run_not_pass() -> None:
    """examples/honest_norm is bound to MiniMax-M3: in Qwen3-MoE no call is in its domain."""
    from pathlib import Path

    bundle = Path(__file__).parents[2] / "examples" / "honest_norm"
    cell, = run_matrix(["qwen3-moe"], ["norm.rmsnorm"], bundle=bundle, trust_unverified=True, **SMALL)
    assert cell.status == NOT_RUN and "domain" in cell.reason
    cell, = run_matrix(["minimax-m3"], ["norm.rmsnorm"], bundle=bundle, trust_unverified=True, **SMALL)
    assert cell.status == PASS, cell.reason


def test_quiet_drops_exactly_the_known_import_noise() -> None:
    import logging

    from kernelslot.engines.quiet import quiet_library_imports

    quiet_library_imports()
    quiet_library_imports()  # idempotent
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).addHandler(Catch())
    try:
        logging.getLogger("torchao").warning("Failed to load /x/site-packages/torchao/_C_mxfp8.abi3.so: no CUDA")
        logging.getLogger("torch.utils._pytree").warning(
            "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile as an "
            "opaque value type. Please use that instead.")
        logging.getLogger("torchao").warning("Failed to quantize layer 3")  # a real problem: printed
    finally:
        for name in ("torchao", "torch.utils._pytree"):
            logging.getLogger(name).handlers = [h for h in logging.getLogger(name).handlers if not isinstance(h, Catch)]
    assert seen == ["Failed to quantize layer 3"]


@pytest.mark.slow
def test_e2e_prints_its_report_not_library_import_noise() -> None:
    """torchao's 'Failed to load .../torchao/_C*.so' and torch's pytree 'is an Enum subclass' lines
    (printed by a bare import of the model classes, checked first) do not reach the e2e output."""
    code = "from kernelslot.engines.transformers.models import build_model; build_model('qwen3-moe')"
    bare = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    cmd = [sys.executable, "-m", "kernelslot", "e2e", "--model", "qwen3-moe", "--slot", "norm.rmsnorm",
           "--prompts", "1", "--prompt-len", "2", "--steps", "1"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    text = run.stdout + run.stderr
    assert "PASS" in run.stdout
    for noise in ("torchao/_C", "is an Enum subclass"):
        assert noise not in text, noise
    if "torchao/_C" not in bare.stderr and "Enum subclass" not in bare.stderr:
        pytest.skip("this environment's libraries print no import noise to suppress")
