"""The oracle self-test: every profile rejects a battery of trivially wrong answers.

The default suite runs a representative subset (each slot's first profile, plus its smallest
low-bit profile); the whole catalog runs under ``-m slow`` and must pass too.
"""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from kernelslot.abi import AllClose, Cosine, MatchedRatio
from kernelslot.cli import main
from kernelslot.slots import CATALOG, Candidate, Kernel, get_slot
from kernelslot.slots.base import LOW_BIT
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.oracle import oracle_profile, oracle_slot, round_significand
from tests.cheats import moe_block_renormalise_topk as cheat


def _size(profile):
    return math.prod(v for v in profile.dims.values() if isinstance(v, int) and not isinstance(v, bool) and v > 0)


def _representative(defn):
    """The slot's first profile (the small one by convention) and its smallest low-bit profile."""
    low_bits = [p for p in defn.profiles if LOW_BIT in p.tags]
    return [defn.profiles[0]] + ([min(low_bits, key=_size)] if low_bits else [])


def _assert_caught(defn, profiles):
    judged = set()
    for p in profiles:
        r = oracle_profile(defn, p)
        assert r.answers, f"{defn.name} {p.label}: no wrong answer could be judged (every profile must be able to fail)"
        bad = [f"{a.kind} [{a.output}] margin {a.margin:.3g}: {a.detail}" for a in r.accepted]
        assert not bad, f"{defn.name} {p.label} accepts wrong answers: " + "; ".join(bad)
        judged |= {a.kind for a in r.answers}
    return judged


@pytest.mark.parametrize("slot", sorted(CATALOG))
def test_representative_profiles_reject_the_battery(slot):
    defn = CATALOG[slot]
    _assert_caught(defn, _representative(defn))


@pytest.mark.slow
@pytest.mark.parametrize("slot", sorted(CATALOG))
def test_every_profile_rejects_the_battery(slot):
    defn = CATALOG[slot]
    judged = _assert_caught(defn, defn.profiles)
    idle = [n.name for n in defn.near_misses if f"near-miss: {n.name}" not in judged]
    assert not idle, f"{slot}: near-misses no profile exercises: {idle}"


def test_battery_covers_the_named_kinds():
    defn = get_slot("norm.rmsnorm")
    r = oracle_profile(defn, next(p for p in defn.profiles if p.name == "ragged_rows_nonpow2"))
    kinds = {a.kind.split(" at ")[0] for a in r.answers}
    assert {"zeros", "constant", "copy of x", "row dropped"} <= kinds
    assert any(k.startswith("rounded to") for k in kinds)


def test_a_loose_comparator_is_reported_as_a_catalog_defect():
    # rtol 1 alone admits zeros anywhere: the battery must say so
    defn = get_slot("norm.rmsnorm")
    loose = dataclasses.replace(defn, comparator=AllClose(atol=0.0, rtol=1.0))
    tiny = next(p for p in defn.profiles if p.name == "tiny_values_eps_dominated" and p.dtype == torch.float32)
    accepted = {a.kind for a in oracle_profile(loose, tiny).accepted}
    assert "zeros" in accepted


def test_row_scaled_atol_rejects_zeros_on_a_tiny_row():
    expected = torch.tensor([[1.0, -2.0, 0.5, 1.5], [1e-3, -2e-3, 5e-4, 1e-3]])
    zeroed = expected.clone()
    zeroed[1] = 0
    for cmp in (AllClose(atol=2e-2, rtol=2e-2), MatchedRatio(0.5, atol=2e-2, rtol=2e-2)):
        v = cmp.compare(zeroed, expected)
        assert not v.passed and v.margin > 1, v.describe()
        ok = cmp.compare(expected * (1 + 1e-3), expected)
        assert ok.passed and ok.margin <= 1, ok.describe()


def test_margins_are_the_worst_statistic_over_its_bound():
    e = torch.ones(2, 4)
    a = e.clone()
    a[0, 0] = 1.03  # error 0.03 against allclose tolerance 1e-2·1 + 1e-2·1 = 0.02
    assert AllClose(atol=1e-2, rtol=1e-2).compare(a, e).margin == pytest.approx(1.5)
    # matched_ratio: 1 of 8 cells unmatched against 1 - 0.75 allowed; gross bound 8·0.02
    v = MatchedRatio(0.75, atol=1e-2, rtol=1e-2).compare(a, e)
    assert v.passed and v.margin == pytest.approx(max(0.125 / 0.25, 0.03 / 0.16))
    # cosine: a zeroed row of a large batch keeps the global cosine, not the row guard
    big = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    dropped = big.clone()
    dropped[5] = 0
    assert Cosine(0.95, 0.05).compare(dropped, big).passed
    v = Cosine(0.95, 0.05, row_min_cos=0.9).compare(dropped, big)
    assert not v.passed and v.margin == pytest.approx(10.0)


def test_round_significand():
    x = torch.tensor([1.0, 1.1, 1.2, -3.0, 0.0, float("inf")])
    assert round_significand(x, 1).tolist() == [1.0, 1.0, 1.0, -4.0, 0.0, float("inf")]
    assert round_significand(x, 4).tolist() == pytest.approx([1.0, 1.125, 1.25, -3.0, 0.0, float("inf")])


def test_zeros_on_tiny_rows_cheat_targets_a_profile_with_tiny_rows():
    defn = get_slot("norm.rmsnorm")
    tiny = next(p for p in defn.profiles if p.name == "tiny_values_eps_dominated" and p.dtype == torch.bfloat16)
    out = defn.reference(defn.make_case(tiny, torch.Generator().manual_seed(0)))["out"]
    assert (out.abs().amax(-1) <= 2e-2).any()  # the cheat has rows to zero: it is caught, not idle


def test_cli_oracle_table_and_json(capsys):
    assert main(["slots", "activation.silu_and_mul", "--oracle"]) == 0
    text = capsys.readouterr().out
    assert "min margin" in text and "=> PASS" in text and "zeros" in text
    assert main(["slots", "activation.silu_and_mul", "--oracle", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["slot"] == "activation.silu_and_mul" and data[0]["passed"]
    assert data[0]["min_margin"] > 1 and all(a["caught"] for p in data[0]["profiles"] for a in p["answers"])


def test_cli_oracle_unknown_slot_is_bad_input(capsys):
    assert main(["slots", "no.such_slot", "--oracle"]) == 2
    assert "unknown slot" in capsys.readouterr().err


def test_every_slot_declares_near_misses():
    assert not [name for name, d in CATALOG.items() if not d.near_misses]


def test_near_miss_is_judged_with_the_slot():
    defn = get_slot("moe.fused_experts")
    swiglu = next(p for p in defn.profiles if p.name == "minimax_swigluoai_clamped" and p.dtype == torch.float32)
    r = oracle_profile(defn, swiglu)
    silu = next(a for a in r.answers if a.kind == "near-miss: SiLU for swigluoai")
    assert silu.caught and silu.by == "compare"
    generic = next(p for p in defn.profiles if p.name == "ragged_batch_nonpow2")
    skipped = oracle_profile(defn, generic).skipped
    assert ("near-miss: SiLU for swigluoai", "*", "not exercised by this profile") in skipped


def test_oracle_slot_runs_every_profile():
    defn = get_slot("activation.silu_and_mul")
    assert [r.profile for r in oracle_slot(defn)] == [p.label for p in defn.profiles]


def test_a_failed_comparison_names_the_near_miss_it_matches():
    defn = get_slot("moe.block_tkg")
    profile = next(p for p in defn.profiles if p.name == "t1_selective_dense" and p.dtype == torch.float32)
    report = verify_slot(dataclasses.replace(defn, profiles=(profile,)), Candidate(Kernel(cheat.entry, cheat.prepare)),
                         VerifyOptions(dtypes=(torch.float32,)))
    messages = [c.message for r in report.results for c in r.failures()]
    assert any("it matches the reference with routing weights renormalised" in m for m in messages), messages


@pytest.mark.parametrize("slot", ["norm.rmsnorm", "activation.silu_and_mul"])
def test_a_float16_output_rounded_through_bfloat16_is_caught_by_its_ulps(slot):
    """fp32 math with one cast: the battery holds the bf16-rounded float16 answer, and it is the
    ulp judgement, not the 1e-2 tolerance, that rejects it."""
    defn = get_slot(slot)
    for profile in [p for p in defn.profiles if p.dtype == torch.float16]:
        r = oracle_profile(defn, profile)
        bf16 = next(a for a in r.answers if a.kind == "rounded through bfloat16")
        assert bf16.caught and bf16.by == "compare" and "within_1ulp" in bf16.detail, (profile.label, bf16)
        assert bf16.margin > 20, (profile.label, bf16.margin)
    bf = next(p for p in defn.profiles if p.dtype == torch.bfloat16)
    assert not any(a.kind == "rounded through bfloat16" for a in oracle_profile(defn, bf).answers)


@pytest.mark.parametrize("slot", ["moe.fused_experts", "moe.block_tkg"])
def test_low_bit_profiles_reject_what_their_slot_resolves(slot):
    """moe.fused_experts' NVFP4 profiles and moe.block_tkg's MX profiles must reject the output
    rounded to 2 significant bits (E2M1's precision), each well past its bound: block_tkg's
    reference admits each MX activation path as an alternative, so its matched_ratio needs no
    allowance for the distance between paths."""
    defn = get_slot(slot)
    assert defn.low_bit_resolution == 2
    low_bit = [p for p in defn.profiles if LOW_BIT in p.tags]
    assert low_bit
    for profile in low_bit:
        answers = {a.kind: a for a in oracle_profile(defn, profile).answers}
        two = answers["rounded to 2 significant bits (E2M1's precision)"]
        assert two.caught and two.by == "compare" and two.margin > 5, (profile.label, two.margin)
        assert answers["rounded to 1 significant bit (below E2M1)"].caught
