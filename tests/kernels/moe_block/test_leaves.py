"""The 2×2 leaves: all-expert == selective == the twin, per format and scaling mode;
MX == the same computation on dequantised weights with the same activation quantisation."""
from __future__ import annotations

import itertools

import pytest
import torch

from kernelslot.kernels.experts_spec import ScalingMode
from kernelslot.kernels.moe_block.expert_weights import as_dense
from kernelslot.kernels.moe_block.leaves import all_expert_experts, experts_reference, selective_experts
from kernelslot.kernels.moe_block.masking import routed_indicator
from kernelslot.kernels.experts_spec import ExpertActivation
from kernelslot.slots.moe_block import make_expert_weights

FORMATS = ("dense", "fp8_row", "mxfp4", "mxfp8", "nvfp4")
MX = ("mxfp4", "mxfp8")


def _setup(fmt: str, seed: int = 3, tokens: int = 6, hidden: int = 64, inter: int = 32, experts: int = 6, k: int = 2,
           biases: bool = True):
    g = torch.Generator().manual_seed(seed)
    w = make_expert_weights(fmt, experts, hidden, inter, g, torch.float32, biases)
    h = torch.randn(tokens, hidden, generator=g)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    ids[0, 1] = -1  # an expert on another rank
    aff = torch.rand(tokens, k, generator=g) + 0.1
    return w, h, ids, aff


def _sheet(ids: torch.Tensor, aff: torch.Tensor, experts: int) -> torch.Tensor:
    sheet = torch.zeros(ids.shape[0], experts + 1)
    sheet.scatter_(1, torch.where(ids >= 0, ids, experts), aff)
    return sheet[:, :experts]


@pytest.mark.parametrize("fmt, scaling", list(itertools.product(FORMATS, (ScalingMode.POST_SCALE, ScalingMode.NO_SCALE))))
def test_all_expert_equals_selective_equals_twin(fmt: str, scaling: ScalingMode) -> None:
    w, h, ids, aff = _setup(fmt)
    act = ExpertActivation.swigluoai()
    mx = fmt in MX
    sel = selective_experts(w, h, ids, aff, act, scaling, mx)
    full = all_expert_experts(w, h, ids, _sheet(ids, aff, w.num_experts), act, scaling, mx)
    ref = experts_reference(w, h, ids, aff, act, scaling, mx)
    torch.testing.assert_close(sel, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt", MX)
def test_mx_equals_dequantised_dense_with_the_same_activation_quantisation(fmt: str) -> None:
    w, h, ids, aff = _setup(fmt)
    act = ExpertActivation("silu")
    got = selective_experts(w, h, ids, aff, act, ScalingMode.POST_SCALE, True)
    dense = selective_experts(as_dense(w), h, ids, aff, act, ScalingMode.POST_SCALE, True)
    torch.testing.assert_close(got, dense, atol=0, rtol=0)
    # ... and the activation quantisation is really there: without it the result moves.
    unquantised = selective_experts(as_dense(w), h, ids, aff, act, ScalingMode.POST_SCALE, False)
    assert not torch.allclose(got, unquantised, atol=1e-4, rtol=1e-4)


def test_no_scale_sums_the_routed_set_not_the_non_zero_columns() -> None:
    # A routed expert with affinity 0 still counts under NO_SCALE (the seed library would drop it).
    w, h, ids, aff = _setup("dense")
    aff[:, 0] = 0.0
    act = ExpertActivation("silu")
    full = all_expert_experts(w, h, ids, _sheet(ids, aff, w.num_experts), act, ScalingMode.NO_SCALE)
    ones = selective_experts(w, h, ids, torch.ones_like(aff), act, ScalingMode.POST_SCALE)
    torch.testing.assert_close(full, ones, atol=1e-5, rtol=1e-5)


def test_all_expert_skips_experts_with_an_all_zero_column() -> None:
    w, h, ids, aff = _setup("dense", biases=True)
    ids = torch.where(ids == 0, torch.full_like(ids, -1), ids)  # nobody routes to expert 0 now
    sheet = _sheet(ids, aff, w.num_experts)
    assert not bool(sheet[:, 0].ne(0).any())
    poisoned = type(w)(w.format, w.gate_up.clone(), w.down.clone(), gate_up_bias=w.gate_up_bias, down_bias=w.down_bias)
    poisoned.gate_up[0] = float("nan")  # would poison the sum if expert 0 ran
    out = all_expert_experts(poisoned, h, ids, sheet, ExpertActivation("silu"), ScalingMode.POST_SCALE)
    assert bool(torch.isfinite(out).all())


def test_indicator_counts_each_routed_expert_once() -> None:
    assert routed_indicator(torch.tensor([[2, -1], [0, 2]]), 3).tolist() == [[0, 0, 1], [1, 0, 1]]


@pytest.mark.parametrize("mode", [ScalingMode.PRE_SCALE, ScalingMode.PRE_SCALE_DELAYED])
def test_pre_scale_modes_are_rejected(mode: ScalingMode) -> None:
    w, h, ids, aff = _setup("dense")
    with pytest.raises(ValueError, match="PRE_SCALE"):
        selective_experts(w, h, ids, aff, ExpertActivation(), mode)
    with pytest.raises(ValueError, match="PRE_SCALE"):
        all_expert_experts(w, h, ids, _sheet(ids, aff, w.num_experts), ExpertActivation(), mode)


def test_out_of_range_local_id_is_rejected() -> None:
    w, h, ids, aff = _setup("dense")
    ids[1, 0] = w.num_experts
    with pytest.raises(ValueError, match="local ids"):
        selective_experts(w, h, ids, aff, ExpertActivation(), ScalingMode.POST_SCALE)


@pytest.mark.parametrize("fmt", FORMATS)
def test_row_chunked_projection_equals_the_whole_matrix(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelslot.kernels.moe_block import expert_weights

    g = torch.Generator().manual_seed(5)
    w = make_expert_weights(fmt, 2, 96, 64, g, torch.float32, biases=True)
    x = torch.randn(3, 96, generator=g)
    whole = expert_weights.expert_projection(w, 1, "gate_up")(x)
    monkeypatch.setattr(expert_weights, "CHUNK_ELEMENTS", 40 * 96)  # 40-row chunks of 128 rows: 40, 40, 40, 8
    chunked = expert_weights.expert_projection(w, 1, "gate_up")(x)
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    gate_up = expert_weights.expert_gate_up(w, 1)
    torch.testing.assert_close(whole, x @ gate_up.t() + w.gate_up_bias[1], atol=1e-5, rtol=1e-5)
