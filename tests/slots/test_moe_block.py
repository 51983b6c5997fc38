"""The moe.block_tkg slot definition: profile coverage, case shapes, reference facts."""
from __future__ import annotations

import torch

from kernelslot.kernels.moe_block import ScalingMode
from kernelslot.slots import CATALOG
from kernelslot.slots.moe_block import SLOTS, moe_block_reference

BLOCK = SLOTS[0]


def _case(profile, seed: int = 0):
    return BLOCK.make_case(profile, torch.Generator().manual_seed(seed))


def test_registered_in_the_catalog() -> None:
    assert CATALOG["moe.block_tkg"] is BLOCK
    assert BLOCK.slot.signature() == (
        "prepare(kind, layer) -> prepared; entry(x, residual, prepared, eps, out, out_residual, router_logits)"
    )


def test_profiles_cover_the_required_axes() -> None:
    cases = [(p, _case(p)) for p in BLOCK.profiles]
    assert {p.model for p in BLOCK.profiles} == {"generic", "qwen3-moe", "gpt-oss", "MiniMax-M3"}
    assert {p.dtype for p in BLOCK.profiles} == {torch.float32, torch.bfloat16, torch.float16}
    tokens = {p.dims["T"] for p in BLOCK.profiles}
    assert min(tokens) == 1 and max(tokens) == 128
    layers = [c.prepare_args[1] for _, c in cases]
    assert {lay.experts.format for lay in layers} == {"dense", "fp8_row", "mxfp4", "mxfp8", "nvfp4"}
    assert {lay.config.strategy for lay in layers} == {"all_expert", "selective", "auto"}
    assert any(lay.config.rank_id > 0 and lay.config.num_local_experts < lay.config.num_experts for lay in layers)
    assert any(lay.config.scaling is ScalingMode.NO_SCALE for lay in layers)
    assert any(lay.shared is not None and lay.shared.gate is not None for lay in layers)
    # the keystone corner is exercised on the all-expert path
    assert any(lay.config.needs_index_mask and lay.config.strategy == "all_expert" for lay in layers)
    for flag in ("out_residual", "router_logits"):
        present = {c.outputs[flag] is not None for _, c in cases}
        assert present == {True, False}, flag
    for p in BLOCK.profiles:
        assert p.dims["H"] <= 256 and p.dims["E"] <= 16


def test_case_shapes_do_not_depend_on_the_seed() -> None:
    for p in BLOCK.profiles[:6]:
        a, b = _case(p, 0), _case(p, 1)
        assert a.inputs["x"].shape == b.inputs["x"].shape
        assert not torch.equal(a.inputs["x"], b.inputs["x"])
        assert {k: v and v.shape for k, v in a.outputs.items()} == {k: v and v.shape for k, v in b.outputs.items()}


def test_reference_counts_only_the_routed_experts_of_this_rank() -> None:
    # Zero every local expert's down projection except one: the output must come only from
    # tokens that routed to that expert on this rank.
    profile = next(p for p in BLOCK.profiles if p.name == "t7_all_expert_ep_rank1" and p.dtype == torch.float32)
    case = _case(profile)
    layer = case.prepare_args[1]
    keep = 2  # global expert 10: routed by some tokens of this seed, not by others
    layer.experts.down[torch.arange(layer.experts.num_experts) != keep] = 0.0
    got = moe_block_reference(case.inputs["x"], None, layer, 1e-6)
    logits = got["router_logits"]
    chosen = torch.softmax(logits, -1).topk(layer.config.top_k, -1).indices
    routed = (chosen == layer.config.expert_offset + keep).any(-1)
    assert bool(routed.any()) and bool((~routed).any())
    assert bool(got["out"][~routed].eq(0).all()) and bool(got["out"][routed].ne(0).any(-1).all())
