"""Boundary profiles (verify/envelope.py) build valid cases that reach the sizes they name."""
from __future__ import annotations

import pytest
import torch

from kernelslot.abi import CallDescriptor, CapabilityDomain, SlotKind
from kernelslot.slots import CATALOG, Candidate, Kernel, get_slot
from kernelslot.verify.envelope import boundary_profiles, case_bytes, envelope_domain, verified_envelope
from kernelslot.verify.single.pipeline import describe, make_case

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
        assert b.joint is None or desc.get(b.joint[0]) == b.joint[1], (b.profile.name, b.joint)


def test_envelope_fields_limit_the_extended_fields_and_are_checked(capsys):
    from kernelslot.cli import main

    defn = get_slot("attention.sdpa")
    ran = [(p, describe(defn, make_case(defn, p, 0, 0), p, "cpu")) for p in defn.profiles]
    bounds = boundary_profiles(defn, Candidate(defn.incumbent), ran, 64 << 20, lambda p: make_case(defn, p, 0, 0), {},
                               ("kv_len",))
    assert bounds and {b.field for b in bounds} == {"kv_len"}
    assert main(["verify", "--slot", "norm.rmsnorm", "--envelope-field", "tokens"]) == 2
    assert "not a size field" in capsys.readouterr().err


def _bounds(slot, names, field, domain=None):
    """``field``'s boundary profiles of ``slot`` grown from the named fixed profiles only."""
    defn = get_slot(slot)
    ran = [(p, describe(defn, make_case(defn, p, 0, 0), p, "cpu")) for p in defn.profiles if p.label in names]
    cand = Candidate(defn.incumbent, CapabilityDomain.from_mapping(domain or {}))
    return defn, boundary_profiles(defn, cand, ran, 64 << 20, lambda p: make_case(defn, p, 0, 0), {}, (field,))


def test_moe_block_num_experts_grows_with_the_expert_parallel_split_kept():
    defn, bounds = _bounds("moe.block_tkg", {"t7_all_expert_ep_rank1[float32]"}, "num_experts")  # E=16 over 2 ranks
    assert [b.value for b in bounds] == [2, 24, 32]  # the domain's minimum (one expert per rank), between, 2x
    for b in bounds:
        d = b.profile.dims
        desc = defn.describe(make_case(defn, b.profile, 0, 0))
        assert (desc.num_experts, desc.world_size, d["E_L"], d["rank"]) == (b.value, 2, b.value // 2, 1)
        assert desc.top_k == min(4, b.value)


def test_moe_block_world_size_splits_the_same_experts_wider():
    defn, bounds = _bounds("moe.block_tkg", {"t16_all_expert_ep_mxfp4[bfloat16]"}, "world_size")  # E=16 over 4, rank 2
    assert {b.value: (b.profile.dims["E_L"], b.profile.dims["rank"]) for b in bounds} == {1: (16, 0), 8: (2, 4)}
    # a declared maximum past the experts reaches the widest whole split (one expert per rank)
    defn, bounds = _bounds("moe.block_tkg", {"t16_all_expert_ep_mxfp4[bfloat16]"}, "world_size",
                           {"world_size": {"range": [4, 64]}})
    assert [b.value for b in bounds] == [16]
    assert defn.describe(make_case(defn, bounds[0].profile, 0, 0)).num_experts == 16


@pytest.mark.parametrize("slot", ["attention.msa_block_score", "attention.msa_prefill_block_score"])
def test_msa_kv_heads_are_fixed_by_the_signature(slot):
    """One index-key head serves every query head (no head axis in index_k): nothing to extend,
    and the verified envelope routes num_kv_heads = 1 only."""
    defn = get_slot(slot)
    assert "num_kv_heads" not in {f for f, *_ in defn.sizes}
    small = min(defn.profiles, key=lambda p: case_bytes(make_case(defn, p, 0, 0)))
    env = verified_envelope([describe(defn, make_case(defn, small, 0, 0), small, "cpu")])
    assert env["num_kv_heads"] == [1, 1]
    assert not envelope_domain(env).matches(CallDescriptor(num_kv_heads=2))


@pytest.mark.slow  # seconds each: a whole verification of a profile and its boundaries
@pytest.mark.parametrize("cheat", ["wider_num_experts_than_verified", "wider_world_size_than_verified"])
def test_the_incumbent_passes_the_boundaries_that_catch_the_cheat(cheat):
    """The boundaries that fail tests/cheats/CHEAT are fair: the built-in kernel passes them."""
    import importlib

    from kernelslot.verify import VerifyOptions, verify_slot

    mod = importlib.import_module(f"tests.cheats.{cheat}")
    defn = get_slot(mod.SLOT)
    report = verify_slot(defn, defn.builtin_candidates(), VerifyOptions(draws=0, **mod.OPTIONS))
    assert report.passed
    ran = {r.profile for r in report.results}
    assert any("@" + mod.OPTIONS["envelope_fields"][0] in p for p in ran), ran


def test_every_pair_of_extended_fields_gets_a_corner_at_both_maxima():
    defn = get_slot("norm.rmsnorm")
    ran = [(p, describe(defn, make_case(defn, p, 0, 0), p, "cpu")) for p in defn.profiles]
    bounds = boundary_profiles(defn, Candidate(defn.incumbent), ran, 64 << 20, lambda p: make_case(defn, p, 0, 0), {})
    corners = [b for b in bounds if b.joint is not None]
    assert [(b.field, b.value, b.joint) for b in corners] == [("num_tokens", 64, ("hidden_size", 4096))]
    desc = describe(defn, make_case(defn, corners[0].profile, 0, 0), corners[0].profile, "cpu")
    assert (desc.num_tokens, desc.hidden_size) == (64, 4096)
    singles = [b for b in bounds if b.joint is None]
    assert max(b.value for b in singles if b.field == "num_tokens") == 64
    assert max(b.value for b in singles if b.field == "hidden_size") == 4096
    # a corner that does not fit the memory bound is clipped, and said so
    clipped: dict[str, str] = {}
    small = boundary_profiles(defn, Candidate(defn.incumbent), ran, 1 << 20, lambda p: make_case(defn, p, 0, 0), clipped)
    assert "never ran together" in clipped.get("num_tokens+hidden_size", ""), clipped
    assert all(case_bytes(make_case(defn, b.profile, 0, 0)) <= 1 << 20 for b in small if b.joint is not None)


def test_the_envelope_records_what_ran_so_an_unrun_corner_is_not_routed():
    """Boundaries that move one field at a time verify neither field's maximum together with the
    other's: the box around them covered that corner, the staircase they leave does not."""
    defn = get_slot("norm.rmsnorm")
    ran = [(p, describe(defn, make_case(defn, p, 0, 0), p, "cpu")) for p in defn.profiles]
    bounds = boundary_profiles(defn, Candidate(defn.incumbent), ran, 64 << 20, lambda p: make_case(defn, p, 0, 0), {})
    singles = [describe(defn, make_case(defn, b.profile, 0, 0), b.profile, "cpu") for b in bounds if b.joint is None]
    env = verified_envelope([d for _, d in ran] + singles)
    corner = CallDescriptor(num_tokens=64, hidden_size=4096)
    assert env["num_tokens"] == [1, 64] and env["hidden_size"] == [1, 4096]  # the box would hold the corner
    assert envelope_domain({f: env[f] for f in ("num_tokens", "hidden_size")}).matches(corner)
    assert not envelope_domain(env).matches(corner)
    assert all(envelope_domain(env).matches(d) for d in [d for _, d in ran] + singles)  # every run is inside


def test_the_corner_cheat_fails_at_the_corner_and_an_honest_envelope_covers_its_runs():
    import dataclasses

    from kernelslot.verify import VerifyOptions, verify_slot
    from tests.cheats import wrong_only_at_joint_corner as cheat

    defn = get_slot(cheat.SLOT)
    opts = VerifyOptions(dtypes=(torch.float32,), draws=0, **cheat.OPTIONS)
    report = verify_slot(defn, Candidate(Kernel(cheat.entry, name="cheat")), opts)
    failed = {r.profile for r in report.results if not r.passed}
    assert failed == {"decode_batch@num_tokens=64,hidden_size=4096"}, failed  # only the corner
    honest = verify_slot(defn, Candidate(defn.incumbent), dataclasses.replace(opts, plan_seed=1))
    assert honest.passed
    st = envelope_domain(honest.envelope[defn.incumbent.name])
    assert st.matches(CallDescriptor(num_tokens=64, hidden_size=4096))  # the corner ran and passed
    by_label = {p.label: p for p in defn.profiles}
    for r in honest.results:
        base = by_label.get(f"{r.profile}[{r.dtype}]")
        if base is not None:
            assert st.matches(describe(defn, make_case(defn, base, 0, 0), base, "cpu")), r.profile
