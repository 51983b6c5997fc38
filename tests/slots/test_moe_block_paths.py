"""MX activation paths: the reference admits each conforming path, and nothing coarser passes.

An MX block may feed its experts MXFP8 of fp32 activations (the seed's path, the canonical
answer), unquantised activations (weight-only), MXFP8 of bf16-rounded activations (bf16-first),
or either mixture (slots/moe_block.MX_PATHS). One path's answer is several of the slot's
tolerances from another's, so the reference computes `out` under each and every token's row is
judged, by the slot's matched_ratio, against the nearest: the honest kernels of
tests/slots/moe_block_paths.py pass, and each of them fails where its own path is not admitted.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelslot.abi.comparators import AnyOfRows, canonical_expected, resolve_expected
from kernelslot.slots import Candidate
from kernelslot.slots.base import LOW_BIT
from kernelslot.slots import moe_block as block_slot
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.single.pipeline import clone_case
from tests.slots import moe_block_paths as honest

BLOCK = block_slot.SLOTS[0]
MX_PROFILES = tuple(p for p in BLOCK.profiles if LOW_BIT in p.tags)
MX_ONLY = dataclasses.replace(BLOCK, profiles=MX_PROFILES)
N_PATHS = len(block_slot.MX_PATHS)
MX_DTYPES = tuple({p.dtype for p in MX_PROFILES})  # bfloat16 (docs/moe_block.md: MX profiles run in bfloat16 only)
# the honest variants (name in moe_block_paths.PATHS) and the admitted path each computes
VARIANTS = {"weight_only": "weight-only", "weight_only_bf16_activations": "weight-only", "bf16_first": "bf16-first",
            "bf16_first_input": "bf16-first input", "bf16_first_intermediate": "bf16-first intermediate"}


def _failures(report) -> list:
    return [(r.profile, r.dtype, [c.detail for c in r.failures()]) for r in report.results if not r.passed]


def test_paths_are_data_with_the_seed_path_first() -> None:
    names = [p.name for p in block_slot.MX_PATHS]
    assert names[0] == "mxfp8" and (block_slot.MX_PATHS[0].input, block_slot.MX_PATHS[0].intermediate) == ("mxfp8",) * 2
    assert set(VARIANTS.values()) <= set(names) and len(set(names)) == len(names)
    for p in block_slot.MX_PATHS:
        assert {p.input, p.intermediate} <= set(block_slot.MX_ACTIVATION_TREATMENTS), p
    assert all(p.dims["format"] in ("mxfp4", "mxfp8") for p in MX_PROFILES) and len(MX_PROFILES) >= 4
    assert BLOCK.low_bit_resolution == 2


def test_mx_reference_holds_every_path_and_the_canonical_answer_is_the_seeds() -> None:
    for profile in MX_PROFILES:
        case = BLOCK.make_case(profile, torch.Generator().manual_seed(0))
        inp, layer = case.inputs, case.prepare_args[1]
        got = block_slot.moe_block_reference(inp["x"], inp["residual"], layer, inp["eps"], admissible=True)["out"]
        seed = block_slot.moe_block_reference(inp["x"], inp["residual"], layer, inp["eps"])["out"]
        assert isinstance(got, AnyOfRows) and got.choices.shape[0] % len(block_slot.MX_PATHS) == 0, profile.label
        assert torch.equal(canonical_expected(got), seed), profile.label
        # the paths really differ: the weight-only answer is not the seed's
        per_path = got.choices.shape[0] // len(block_slot.MX_PATHS)
        assert not torch.equal(got.choices[per_path], seed), profile.label


def _choices(profile, seed: int = 0) -> int:
    out = block_slot._reference(BLOCK.make_case(profile, torch.Generator().manual_seed(seed)))["out"]
    return out.choices.shape[0] if isinstance(out, AnyOfRows) else 1


def test_only_mx_experts_have_path_alternatives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every profile's admissible answers multiply by the number of paths on MX experts, and only there
    (dense, FP8-row and NVFP4 experts keep their routing alternatives alone: the reference costs as before)."""
    full = {p.label: _choices(p) for p in BLOCK.profiles}
    monkeypatch.setattr(block_slot, "MX_PATHS", block_slot.MX_PATHS[:1])
    for p in BLOCK.profiles:
        assert full[p.label] == _choices(p) * (N_PATHS if LOW_BIT in p.tags else 1), p.label


def test_each_row_is_judged_against_its_nearest_path() -> None:
    """A row from the weight-only answer and a row from the bf16-first answer, side by side, resolve to
    those paths' rows (the seed's canonical answer is several tolerances from both)."""
    profile = next(p for p in MX_PROFILES if p.name == "t32_skew_hot_expert_mxfp4")
    case = BLOCK.make_case(profile, torch.Generator().manual_seed(0))
    ref = block_slot._reference(clone_case(case))["out"]
    n = ref.choices.shape[0] // len(block_slot.MX_PATHS)
    names = [p.name for p in block_slot.MX_PATHS]
    weight_only, bf16_first = ref.choices[n * names.index("weight-only")], ref.choices[n * names.index("bf16-first")]
    mixed = torch.where((torch.arange(weight_only.shape[0]) % 2 == 0).unsqueeze(1), weight_only, bf16_first)
    assert torch.equal(resolve_expected(ref, mixed), mixed)
    written = mixed.to(torch.bfloat16)  # as a candidate writes it: judged against the nearest rows, it passes
    comparator = BLOCK.comparator_for("out", profile)
    assert comparator.compare(written, resolve_expected(ref, written)).passed
    assert not comparator.compare(written, canonical_expected(ref)).passed


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_honest_path_variant_passes_every_mx_profile(variant: str) -> None:
    report = verify_slot(MX_ONLY, Candidate(honest.kernel(variant)), VerifyOptions(dtypes=MX_DTYPES, seeds=(0, 1), draws=2))
    assert report.passed, _failures(report)
    assert len([r for r in report.results if r.drawn]) >= 2  # drawn T and K around the MX bases too


def test_the_seed_path_written_stage_by_stage_passes() -> None:
    """The control: the same helper with the seed's activations passes as the built-in does."""
    report = verify_slot(MX_ONLY, Candidate(honest.kernel("mxfp8")), VerifyOptions(dtypes=MX_DTYPES, draws=0))
    assert report.passed, _failures(report)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_variant_fails_where_its_path_is_not_admitted(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The alternative is what admits the variant: without its path the slot's comparator rejects it."""
    kept = tuple(p for p in block_slot.MX_PATHS if p.name != VARIANTS[variant])
    monkeypatch.setattr(block_slot, "MX_PATHS", kept)
    report = verify_slot(MX_ONLY, Candidate(honest.kernel(variant)), VerifyOptions(dtypes=MX_DTYPES, draws=0))
    assert not report.passed
    names = {c.name for r in report.results for c in r.failures()}
    assert "compare" in names and names <= {"compare", "replay", "reprepare"}, names
