"""The referee must reject the known ways to get the MoE decode block subtly wrong."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kernelslot.slots.base import Candidate, Kernel
from kernelslot.slots.moe_block import SLOTS
from kernelslot.verify import VerifyOptions, verify_slot

CHEATS = Path(__file__).resolve().parents[1] / "cheats"
BLOCK = SLOTS[0]


def _load(name: str) -> Kernel:
    spec = importlib.util.spec_from_file_location(f"cheat_{name}", CHEATS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Kernel(entry=module.entry, prepare=module.prepare, name=name)


def test_honest_block_passes_every_profile() -> None:
    report = verify_slot(BLOCK, Candidate(BLOCK.incumbent))
    assert report.passed, [(r.profile, r.dtype, [c.detail for c in r.failures()]) for r in report.results if not r.passed]
    assert len([r for r in report.results if not r.drawn]) == len(BLOCK.profiles)  # plus the drawn ones


@pytest.mark.parametrize(
    "cheat, caught_on",
    [
        ("moe_block_skip_index_mask", "t7_all_expert_ep_rank1"),  # generic: pre-norm softmax, no renorm
        ("moe_block_double_routed_scaling", "t64_all_expert_ep_rank1"),  # MiniMax-M3: factor 2.0
        ("moe_block_renormalise_topk", "t1_selective_dense"),  # generic: norm_topk_prob False
        ("moe_block_two_bit_output", "t1_selective_mxfp4"),  # gpt-oss MXFP4, one token: the smallest MX call
        ("moe_block_two_bit_output", "t32_all_expert_ep_mxfp8"),  # qwen3-moe MXFP8, expert-parallel
    ],
)
def test_cheat_fails_compare(cheat: str, caught_on: str) -> None:
    report = verify_slot(BLOCK, Candidate(_load(cheat)), VerifyOptions(profiles=(caught_on,)))
    assert not report.passed
    failing = [r for r in report.results if not r.passed]
    assert failing and all(r.profile == caught_on for r in failing), [r.profile for r in failing]
    # Caught by the numbers, not by an ABI check: every failure is a numeric mismatch, on the first
    # call, a replay or the reprepare step (which the secret call plan places at random, so whether
    # it runs before the profile stops varies from run to run).
    names = {c.name for r in failing for c in r.failures()}
    assert names <= {"compare", "replay", "reprepare"} and "compare" in names, names
