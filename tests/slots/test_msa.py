"""attention.msa_block_score and attention.msa_prefill_block_score: references, audits, built-ins, cheats."""
from __future__ import annotations

import pytest
import torch

from kernelslot.abi import allocate_output
from kernelslot.kernels.msa import msa_prefill_block_score
from kernelslot.slots import get_slot
from kernelslot.slots.base import Candidate, Case, OutputSpec
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.single.pipeline import make_case
from tests.helpers import cheat_kernel, failures

SCORE = get_slot("attention.msa_block_score")
PREFILL = get_slot("attention.msa_prefill_block_score")
FP32 = VerifyOptions(dtypes=(torch.float32,))


@pytest.mark.parametrize("slot_name", ["attention.msa_block_score", "attention.msa_prefill_block_score"])
def test_builtin_passes_every_profile_and_dtype(slot_name: str) -> None:
    defn = get_slot(slot_name)
    report = verify_slot(defn, Candidate(defn.incumbent))
    assert report.passed, failures(report)
    assert len([r for r in report.results if not r.drawn]) == len(defn.profiles)  # plus the drawn ones
    assert {r.dtype for r in report.results} == {"float32", "bfloat16", "float16"}


def test_minimax_profiles_use_the_real_index_geometry() -> None:
    m3 = next(p for p in PREFILL.profiles if p.model == "MiniMax-M3")
    assert (m3.dims["Hi"], m3.dims["D"], m3.dims["bk"], m3.dims["topk"], m3.dims["local"]) == (4, 128, 128, 16, 1)
    m3 = next(p for p in SCORE.profiles if p.model == "MiniMax-M3")
    assert (m3.dims["Hi"], m3.dims["D"], m3.dims["bs"]) == (4, 128, 128)
    assert all(spec.dtype == torch.float32 for p in SCORE.profiles for spec in make_case(SCORE, p, 0, 0).outputs.values())


@pytest.mark.parametrize(
    "slot_name, cheat, check",
    [
        ("attention.msa_block_score", "msa_block_score_ignores_seq_lens", "compare"),
        ("attention.msa_prefill_block_score", "msa_prefill_acausal", "audit"),
        ("attention.msa_prefill_block_score", "msa_prefill_repeat_padding", "audit"),
    ],
)
def test_cheat_is_caught_by_its_check(slot_name: str, cheat: str, check: str) -> None:
    report = verify_slot(get_slot(slot_name), Candidate(cheat_kernel(cheat)), FP32)
    assert not report.passed
    assert check in report.failed_checks()


def test_repeat_padding_passes_overlap_and_fails_only_the_audit() -> None:
    report = verify_slot(PREFILL, Candidate(cheat_kernel("msa_prefill_repeat_padding")), FP32)
    assert report.failed_checks() == {"audit"}
    assert "duplicate" in report.results[0].check("audit").message


def _hand_case() -> Case:
    """Two requests, D = 1, q = 1, scale 1: block scores are plain key maxima (bk = 2).

    Request 0 (prefix 0, 8 rows, bq 4): keys [0, 5, 1, 1, 9, 0, 2, 3]. Query block 0 sees keys 0..3
    (blocks 0, 1; local = block 1) -> {1, 0}. Query block 1 sees keys 0..7: maxima 5, 1, 9, 3; local
    block 3 forced, then 9 (block 2), 5 (block 0) -> {3, 2, 0}.
    Request 1 (prefix 7, 1 row): eight equal keys -> forced block 3, ties to the lower blocks 0, 1.
    """
    keys = torch.tensor([0, 5, 1, 1, 9, 0, 2, 3] + [1] * 8, dtype=torch.float32).view(16, 1, 1)
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    return Case(
        inputs={
            "q": torch.ones(9, 1, 1), "index_k_cache": keys, "req_to_token": table,
            "slot_ids": torch.tensor([0, 1]), "cu_seqlens": torch.tensor([0, 8, 9], dtype=torch.int32),
            "seq_lens": torch.tensor([8, 8], dtype=torch.int32), "prefix_lens": torch.tensor([0, 7], dtype=torch.int32),
            "max_seqlen_q": 8, "max_seqlen_k": 8, "block_size_q": 4, "block_size_k": 2, "topk": 3, "init_blocks": 0,
            "local_blocks": 1, "scale": 1.0, "cu_seqblocks_q": torch.tensor([0, 2, 3], dtype=torch.int32),
            "max_seqblock_q": 2, "all_seqblock_q": 3,
        },
        outputs={"out_topk": OutputSpec((1, 3, 3), torch.int32, policy="contiguous")},
    )


def test_prefill_reference_and_builtin_on_known_values() -> None:
    case = _hand_case()
    want = [[1, 0, -1], [3, 2, 0], [3, 0, 1]]
    ref = PREFILL.reference(case)["out_topk"]
    assert ref[0].tolist() == want
    out = allocate_output(case.outputs["out_topk"], "cpu")
    out.poison()
    msa_prefill_block_score(*(case.inputs[a.name] if a.name != "out_topk" else out.view for a in PREFILL.slot.args))
    assert [sorted(r[:n]) for r, n in zip(out.view[0].tolist(), (2, 3, 3))] == [sorted(r[:n]) for r, n in zip(want, (2, 3, 3))]
    assert out.view[0, 0, 2] == -1 and out.canary_intact()
    assert PREFILL.audit(case, {"out_topk": out.view}) == []


@pytest.mark.parametrize(
    "row, problem",
    [([0, 2, -1], "not visible"), ([1, 1, -1], "duplicate"), ([-1, 1, 0], "-1 before a valid entry")],
)
def test_prefill_audit_names_each_violation(row: list[int], problem: str) -> None:
    case = _hand_case()
    sel = torch.tensor([[row, [3, 2, 0], [3, 0, 1]]], dtype=torch.int32)  # row 0 sees blocks 0..1 only
    problems = PREFILL.audit(case, {"out_topk": sel})
    assert len(problems) == 1 and problem in problems[0], problems


def test_describe_fills_routing_fields() -> None:
    m3 = next(p for p in PREFILL.profiles if p.model == "MiniMax-M3")
    case = make_case(PREFILL, m3, 0, 0)
    desc = PREFILL.describe(case)
    assert (desc.phase, desc.batch_size, desc.top_k, desc.block_size, desc.num_q_heads, desc.head_dim) == (
        "prefill", 2, 16, 128, 4, 128)
    assert desc.num_tokens == case.inputs["q"].shape[0] and desc.kv_len == case.inputs["max_seqlen_k"]
    prof = next(p for p in SCORE.profiles if p.name == "ragged_seq_lens")
    desc = SCORE.describe(make_case(SCORE, prof, 0, 0))
    assert (desc.phase, desc.batch_size, desc.kv_len, desc.block_size, desc.num_q_heads, desc.num_kv_heads) == (
        "decode", 3, 200, 16, 4, 1)
