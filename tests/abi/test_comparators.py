from __future__ import annotations

import torch

from kernelslot.abi import AllClose, AllOf, Cosine, MatchedRatio, TopKOverlap, UlpShare
from kernelslot.abi.comparators import float_ordinal, ulp_distance


def test_allclose_rejects_nan_and_reports_location():
    e = torch.ones(4, 4)
    a = e.clone()
    a[2, 3] = float("nan")
    v = AllClose().compare(a, e)
    assert not v.passed and "[2, 3]" in v.detail
    assert AllClose().compare(e.clone(), e).passed


def test_matched_ratio_threshold():
    e = torch.ones(100)
    a = e.clone()
    a[:2] = 1.0 + 5e-5  # off by 2.5x the fp32 tolerance: rounding-like, tolerated in 3% of cells
    assert MatchedRatio(0.97).compare(a, e).passed
    a[:5] = 1.0 + 5e-5
    assert not MatchedRatio(0.97).compare(a, e).passed


def test_matched_ratio_rejects_gross_outliers_however_few():
    e = torch.randn(4, 256, generator=torch.Generator().manual_seed(0))
    a = e.clone()
    a[:, 127] = 0.0  # one skipped lane: 0.4% of cells, each wrong by about the row's scale
    v = MatchedRatio(0.97).compare(a, e)
    assert not v.passed and "grossly wrong" in v.detail
    noisy = (e + 1e-6 * torch.randn(4, 256, generator=torch.Generator().manual_seed(1)))
    assert MatchedRatio(0.97).compare(noisy, e).passed


def test_bf16_tolerance_is_looser():
    e = torch.full((10,), 1.0)
    a = torch.full((10,), 1.015).to(torch.bfloat16)
    assert AllClose().compare(a, e).passed
    assert not AllClose().compare(a.float(), e).passed


def test_cosine_norm_guard_catches_scaled_output():
    e = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert Cosine(0.99).compare(e * 1.01, e).passed
    v = Cosine(0.99).compare(e * 2.0, e)
    assert not v.passed and "relative norm" in v.detail
    assert not Cosine(0.99).compare(torch.full_like(e, float("inf")), e).passed


def test_topk_overlap_scores_with_ties_and_nan():
    e = torch.tensor([[5.0, 4.0, 4.0, 1.0, float("-inf")]])
    a_tie = torch.tensor([[5.0, 0.0, 4.0, 1.0, float("-inf")]])  # picks the other tied cell
    assert TopKOverlap(2, 1.0).compare(a_tie, e).passed
    a_bad = torch.tensor([[0.0, 0.0, 0.0, 5.0, 4.0]])
    assert not TopKOverlap(2, 0.5).compare(a_bad, e).passed
    a_nan = e.clone()
    a_nan[0, 3] = float("nan")
    assert "NaN" in TopKOverlap(2, 0.0).compare(a_nan, e).detail


def test_topk_overlap_indices_per_row():
    e = torch.tensor([[0, 1, 2, -1], [3, 4, -1, -1]])
    a = torch.tensor([[2, 1, 0, -1], [3, 5, -1, -1]])
    assert TopKOverlap(4, 0.75, mode="indices").compare(a, e).passed
    assert not TopKOverlap(4, 0.75, mode="indices", per_row=True).compare(a, e).passed


def test_allof_reports_first_failure():
    e = torch.ones(10)
    v = AllOf((Cosine(0.99), MatchedRatio(0.97))).compare(e * 3, e)
    assert not v.passed and v.metric == "cosine"


def test_topk_overlap_empty_rows_agree():
    ninf = float("-inf")
    e = torch.tensor([[ninf, ninf], [1.0, 2.0]])
    assert TopKOverlap(2, 1.0, per_row=True).compare(e.clone(), e).passed
    idx = torch.tensor([[-1, -1], [0, 1]])
    assert TopKOverlap(2, 1.0, mode="indices", per_row=True).compare(idx.clone(), idx).passed
    assert not TopKOverlap(2, 1.0, mode="indices", per_row=True).compare(torch.tensor([[0, -1], [0, 1]]), idx).passed


def test_a_reference_below_the_output_dtypes_resolution_passes_a_correctly_rounded_cell():
    """A one-cell row whose float32 reference (-8.2e-42) lies under bfloat16's subnormal step
    (9.2e-41): the bf16 output holds -0, the correctly rounded value, and must pass (seen as a
    false fail of the direct_activation example at --seed-base 2649038811); ten steps off still fails."""
    expected = torch.tensor([[-8.21581e-42]], dtype=torch.float32)
    for cmp in (AllClose(), MatchedRatio(min_ratio=0.99)):
        assert cmp.compare(torch.tensor([[-0.0]], dtype=torch.bfloat16), expected).passed
    far = torch.tensor([[1e-39]], dtype=torch.float32)
    assert not AllClose().compare(torch.tensor([[0.0]], dtype=torch.bfloat16), far).passed
    assert not AllClose().compare(torch.tensor([[0.0]], dtype=torch.float32), torch.tensor([[1e-40]])).passed


def test_ulp_distance_counts_representable_values_across_zero_and_binades():
    one = torch.tensor([1.0], dtype=torch.float16)
    up = torch.nextafter(one, torch.tensor([2.0], dtype=torch.float16))
    assert int(float_ordinal(up) - float_ordinal(one)) == 1
    assert float_ordinal(torch.tensor([0.0, -0.0], dtype=torch.bfloat16)).tolist() == [0, 0]
    tiny = torch.tensor([6e-8, -6e-8], dtype=torch.float16)  # the smallest subnormals, either side of zero
    assert ulp_distance(tiny[:1], tiny[1:].float()).tolist() == [2.0]
    below = torch.nextafter(one, torch.tensor([0.0], dtype=torch.float16))  # across the binade edge
    assert ulp_distance(below, torch.tensor([1.0])).tolist() == [1.0]
    assert ulp_distance(torch.tensor([float("nan")], dtype=torch.float16), torch.tensor([1.0])).tolist() == [float("inf")]


def test_ulp_share_rejects_a_float16_output_rounded_through_bfloat16_that_allclose_admits():
    e = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    honest = e.to(torch.float16)
    through_bf16 = e.to(torch.bfloat16).to(torch.float16)
    cmp = AllClose(ulps=UlpShare(0.01))
    assert AllClose().compare(through_bf16, e).passed  # float16's 1e-2 is an accumulation allowance
    v = cmp.compare(through_bf16, e)
    assert not v.passed and v.metric == "within_1ulp" and v.margin > 20 and "ulps)" in v.detail, v.describe()
    ok = cmp.compare(honest, e)
    assert ok.passed and ok.metric == "allclose" and ok.margin <= 1
    # one rounding more (an intermediate cast to the output dtype, as engine kernels do) stays within one ulp
    twice = (e * 0.7).to(torch.float16).float().div(0.7).to(torch.float16)
    assert cmp.compare(twice, e).passed
    # float32 outputs are not judged in ulps
    assert UlpShare(0.0).compare(e.to(torch.bfloat16).float(), e).detail == "not judged for torch.float32"


def test_ulp_share_ignores_errors_below_the_rows_scale_and_counts_the_rest():
    e = torch.tensor([[100.0, -50.0, 3e-6, 1.0]])
    a = e.to(torch.float16)
    a[0, 2] = 0.0  # 3e-6 -> 0: many subnormal ulps, but far below an eighth of an ulp at the row's rms
    assert UlpShare(0.0).compare(a, e).passed
    a[0, 3] = 1.01  # 10 ulps at a cell of the row's scale
    v = UlpShare(0.2).compare(a, e)
    assert not v.passed and v.value == 0.75 and v.margin == 1.25


def test_allclose_floor_accepts_what_fp32_math_cannot_resolve_and_nothing_more():
    """silu's fp32 σ underflows where the fp64 reference keeps ~1e-37 (a one-cell row scales no atol)."""
    expected = torch.tensor([[4.97189e-37], [3.0]], dtype=torch.float64)
    underflowed = torch.tensor([[0.0], [3.0]], dtype=torch.bfloat16)
    assert not AllClose().compare(underflowed, expected).passed
    assert AllClose(floor=2.0 ** -100).compare(underflowed, expected).passed
    wrong = torch.tensor([[0.0], [3.0]], dtype=torch.bfloat16)
    assert not AllClose(floor=2.0 ** -100).compare(wrong, torch.tensor([[1e-20], [3.0]], dtype=torch.float64)).passed


def test_a_failed_allclose_names_the_rows_holding_the_differing_cells():
    """A kernel wrong on a thin stride of rows (the arena's miner_silu_sparse) is told which rows."""
    e = torch.randn(200, 8)
    a = e.clone()
    a[::64, 3] += 1.0
    detail = AllClose().compare(a, e).detail
    assert "4 of 1600 cells differ, in 4 of 200 rows: 0, 64, 128, 192; first at [0, 3]" in detail
    b = torch.randn(2, 5, 4)
    c = b.clone()
    c[1, 3, 0] += 1.0
    assert "in 1 of 10 rows: [1, 3];" in AllClose().compare(c, b).detail
    many = e.clone()
    many[:, 0] += 1.0
    assert "in 200 of 200 rows: 0, 1, 2, 3, 4, 5, 6, 7, +192 more;" in AllClose().compare(many, e).detail
    flat = torch.randn(6)
    assert "rows" not in AllClose().compare(flat + 1.0, flat).detail
    ref = torch.randn(3, 64)
    coarse = ref.to(torch.bfloat16)
    coarse[1] = (ref[1] * 1.01).to(torch.bfloat16)  # one row a few ulps off, within allclose's tolerance
    assert ", in 1 of 3 rows: 1; first at [1, " in UlpShare(0.01).compare(coarse, ref).detail


def test_ulp_share_judges_one_cell_rows_at_the_outputs_scale():
    """A row of one cell (silu_and_mul at d = 1) is no scale of its own: torch eager's silu, rounded to
    float16 before the product, leaves a subnormal intermediate a few ulps off a tiny cell; at the
    output's scale that error is far below an eighth of an ulp. A bfloat16-rounded path still fails."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4096, 2, generator=g) * 30).to(torch.float16)
    gate, up = x.double().unbind(-1)
    expected = (torch.nn.functional.silu(gate) * up).unsqueeze(-1)
    eager = (torch.nn.functional.silu(x[:, :1]) * x[:, 1:])  # float16 intermediate, as torch computes it
    cmp = UlpShare(0.01)
    assert cmp.compare(eager, expected).passed
    through_bf16 = expected.to(torch.bfloat16).to(torch.float16)
    assert not cmp.compare(through_bf16, expected).passed
