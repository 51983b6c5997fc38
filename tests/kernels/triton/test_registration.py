"""The Triton variants are registered CUDA-only and lazily: CPU behaviour and the core import path unchanged.

These tests need no triton: they hold whether or not it is installed.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelslot.abi import CallDescriptor
from kernelslot.slots import get_slot
from kernelslot.slots.triton_variants import SM80_PLUS
from kernelslot.verify import VerifyOptions, verify_slot

ROOT = Path(__file__).resolve().parents[3]
HAS_TRITON = importlib.util.find_spec("triton") is not None

# slot -> (Triton variant, the torch variant it supersedes, a model its domain admits)
VARIANTS = {
    "activation.silu_and_mul": [("triton.silu_and_mul", "builtin.silu_and_mul", "generic")],
    "norm.rmsnorm": [("triton.rmsnorm", "builtin.rmsnorm", "MiniMax-M3")],
    "attention.decode": [("triton.decode", "builtin.decode", "generic")],
    "moe.fused_experts": [("triton.fused_experts[silu]", "builtin.fused_experts[silu]", "qwen3-moe"),
                          ("triton.fused_experts[swigluoai]", "builtin.fused_experts[swigluoai]", "MiniMax-M3")],
    "moe.block_tkg": [("triton.moe_block_tkg", "kernelslot.moe_block_tkg", "gpt-oss")],
}


def test_importing_kernelslot_does_not_import_triton() -> None:
    """The catalog, the kernel package and the referee import no triton, and a CPU verification of the
    built-ins loads no Triton kernel module. (torch itself imports an installed triton when the
    referee calls ``torch.use_deterministic_algorithms``: that is torch's, and harmless.)"""
    code = ("import sys\n"
            "import kernelslot, kernelslot.slots, kernelslot.kernels, kernelslot.kernels.triton, kernelslot.verify\n"
            "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.')))\n"
            "from kernelslot.slots import get_slot\n"
            "from kernelslot.verify import VerifyOptions, verify_slot\n"
            "defn = get_slot('activation.silu_and_mul')\n"
            "report = verify_slot(defn, defn.builtin_candidates(), VerifyOptions(profiles=('single_token',), draws=0))\n"
            "assert report.passed, report\n"
            "print(sorted(m for m in sys.modules if m.startswith('kernelslot.kernels.triton.')))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[]", "[]"], done.stdout


@pytest.mark.parametrize("slot", sorted(VARIANTS))
def test_the_triton_variants_route_on_cuda_sm80_plus_only(slot: str) -> None:
    defn = get_slot(slot)
    by_name = {c.name: c for c in defn.builtin_candidates()}
    names = [c.name for c in defn.builtin_candidates()]
    for triton_name, torch_name, model in VARIANTS[slot]:
        tri, tor = by_name[triton_name], by_name[torch_name]
        assert names.index(triton_name) < names.index(torch_name)  # routed ahead of its torch twin
        assert tri.kernel.entry is None and tri.kernel.origin().module.startswith("kernelslot.kernels.triton.")
        assert tri.needs.packages == ("triton",) and tri.needs.archs == SM80_PLUS
        for arch, routed in (("cpu", False), ("sm_75", False), ("sm_80", True), ("sm_90", True), ("sm_120", True)):
            assert tri.domain.matches(CallDescriptor(arch=arch, model=model)) is routed, arch
        assert not tri.domain.matches(CallDescriptor(model=model))  # no arch in the descriptor: a mismatch
        assert "needs CUDA" in tri.needs.unmet("cpu") and tor.needs.unmet("cpu") is None
        assert tor.needs.unmet("sm_75") is None and tri.needs.unmet("sm_75") is not None
        if HAS_TRITON:  # on an sm_80+ device the Triton variant serves the torch variant's whole domain
            assert tri.needs.unmet("sm_90") is None and triton_name in tor.needs.unmet("sm_90")
        else:
            assert "triton" in tri.needs.unmet("sm_90") and tor.needs.unmet("sm_90") is None
        desc = CallDescriptor(arch="sm_90", model=model)
        assert defn.incumbent_for(desc) is tor.kernel  # the Triton variant is timed against its torch twin


def test_a_cpu_verification_leaves_the_triton_variant_out_with_its_reason() -> None:
    defn = get_slot("norm.rmsnorm")
    report = verify_slot(defn, defn.builtin_candidates(), VerifyOptions(profiles=("single_token",), dtypes=(torch.float32,), draws=0))
    assert report.status == "pass"
    assert {r.kernel for r in report.results} == {"builtin.rmsnorm"}
    assert any(n.startswith("triton.rmsnorm: not run: needs CUDA") for n in report.notes), report.notes
