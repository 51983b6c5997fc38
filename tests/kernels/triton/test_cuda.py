"""The compiled Triton variants on a CUDA device, as the built-ins route them (benchmarks/gpu_check.sh).

Needs a CUDA device of sm_80 or later, triton, and ``TRITON_INTERPRET=0`` (tests/conftest.py sets 1 by
default, for the interpreted tests); skipped otherwise.
"""
from __future__ import annotations

import os

import pytest
import torch

from kernelslot.slots import get_slot
from kernelslot.verify import VerifyOptions, verify_slot
from tests.helpers import failures

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1: run with TRITON_INTERPRET=0"),
]

SLOTS = ["activation.silu_and_mul", "norm.rmsnorm", "attention.decode", "moe.fused_experts", "moe.block_tkg"]


@pytest.mark.parametrize("slot", SLOTS)
def test_the_builtins_route_every_profile_to_triton_and_pass(slot: str) -> None:
    pytest.importorskip("triton", reason="triton not installed")
    defn = get_slot(slot)
    # bfloat16 only: benchmarks/gpu_check.sh verifies every dtype through `kernelslot verify --device cuda --time`
    report = verify_slot(defn, defn.builtin_candidates(), VerifyOptions(device="cuda", dtypes=(torch.bfloat16,), draws=0))
    assert report.passed, (failures(report), report.errors)
    ran = [r for r in report.results if not r.skipped_reason]
    assert ran and all(r.kernel.startswith("triton.") for r in ran), {r.kernel for r in ran}
    graph_safe = {c.name for c in defn.builtin_candidates() if c.graph_safe}
    assert all(getattr(r.check("graph_replay"), "status", None) == "pass" for r in ran if r.kernel in graph_safe)
