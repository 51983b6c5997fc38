"""Boundary profiles (verify/envelope.py) build valid cases that reach the sizes they name."""
from __future__ import annotations

import pytest

from kernelslot.abi import SlotKind
from kernelslot.slots import CATALOG, Candidate, get_slot
from kernelslot.verify.envelope import boundary_profiles
from kernelslot.verify.pipeline import describe, make_case

SIZED = sorted(n for n in CATALOG if get_slot(n).sizes and get_slot(n).slot.kind is not SlotKind.COLLECTIVE)
HEAVY = {"attention.decode", "moe.block_tkg", "attention.msa_prefill_block_score", "attention.msa_block_score"}  # seconds each


def test_every_single_device_slot_maps_its_routing_sizes():
    assert set(SIZED) >= {"attention.sdpa", "attention.decode", "attention.msa_block_score",
                          "attention.msa_prefill_block_score", "moe.fused_experts", "moe.block_tkg",
                          "norm.rmsnorm", "activation.silu_and_mul"}


@pytest.mark.parametrize("slot", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in SIZED])
def test_boundaries_are_valid_cases_at_their_size(slot):
    defn = get_slot(slot)
    ran = [(p, describe(defn, make_case(defn, p, 0, 0), p, "cpu")) for p in defn.profiles]
    clipped: dict[str, str] = {}
    bounds = boundary_profiles(defn, Candidate(defn.incumbent), ran, 64 << 20, lambda p: make_case(defn, p, 0, 0), clipped)
    fields = {f for f, *_ in defn.sizes}
    assert {b.field for b in bounds} == fields - set(clipped) or clipped  # every mapped field gets boundaries
    for b in bounds:
        case = make_case(defn, b.profile, 0, 0)
        desc = describe(defn, case, b.profile, "cpu")
        assert desc.get(b.field) == b.value, (b.profile.name, desc.get(b.field))


def test_envelope_fields_limit_the_extended_fields_and_are_checked(capsys):
    from kernelslot.cli import main

    defn = get_slot("attention.sdpa")
    ran = [(p, describe(defn, make_case(defn, p, 0, 0), p, "cpu")) for p in defn.profiles]
    bounds = boundary_profiles(defn, Candidate(defn.incumbent), ran, 64 << 20, lambda p: make_case(defn, p, 0, 0), {},
                               ("kv_len",))
    assert bounds and {b.field for b in bounds} == {"kv_len"}
    assert main(["verify", "--slot", "norm.rmsnorm", "--envelope-field", "tokens"]) == 2
    assert "not a size field" in capsys.readouterr().err
