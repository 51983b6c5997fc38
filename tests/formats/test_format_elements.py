"""E2M1 / E4M3 / E5M2 element conversion and FP4 packing: hand-computed codes, a brute-force
nearest-even reference, and torchao's bit-level kernels."""
from __future__ import annotations

import math

import pytest
import torch

from kernelslot.formats import (
    E2M1_VALUES,
    e2m1_to_float,
    float_to_e2m1,
    fp4_packed_to_float,
    pack_fp4,
    to_e4m3,
    to_e5m2,
    unpack_fp4,
)


def _nearest_even_reference(x: torch.Tensor, grid: torch.Tensor, max_value: float) -> torch.Tensor:
    """Index into the sorted non-negative ``grid`` of the RNE-rounded, saturated |x| (float64
    brute force; among two equally near grid points, the even index wins)."""
    a = x.double().abs().clamp(max=max_value)
    dist = (a.unsqueeze(-1) - grid.double()).abs()
    best = dist.min(dim=-1, keepdim=True).values
    candidates = dist == best
    idx = torch.arange(grid.numel())
    even = candidates & (idx % 2 == 0)
    return torch.where(even.any(-1), even.float().argmax(-1), candidates.float().argmax(-1))


def _edge_values() -> torch.Tensor:
    grid = torch.tensor(E2M1_VALUES[:8])
    mids = (grid[1:] + grid[:-1]) / 2
    pts = torch.cat([grid, mids, torch.tensor([6.5, 7.0, 1e30, 1e-30, 2.0**-149])])
    up = torch.nextafter(pts, torch.full_like(pts, math.inf))
    down = torch.nextafter(pts, torch.zeros_like(pts))
    allv = torch.cat([pts, up, down])
    return torch.cat([allv, -allv])


def test_e2m1_hand_computed_ties_and_saturation() -> None:
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.0001, 7.0, math.inf,
                      -0.1, -0.0, 0.2500001, -6.0, -math.inf, 0.7499999])
    expect = [0, 2, 2, 4, 4, 6, 6, 7, 7, 7, 8, 8, 1, 15, 15, 1]
    assert float_to_e2m1(x).tolist() == expect


def test_e2m1_matches_brute_force_nearest_even() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.cat([_edge_values(), torch.randn(20000, generator=g) * 3])
    grid = torch.tensor(E2M1_VALUES[:8])
    expect = _nearest_even_reference(x, grid, 6.0).to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3)
    assert torch.equal(float_to_e2m1(x), expect)


def test_e2m1_matches_torchao(torchao_mx) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.cat([_edge_values(), torch.randn(20000, generator=g) * 4])
    assert torch.equal(float_to_e2m1(x), torchao_mx["kernels"].f32_to_f4_unpacked(x))


def test_e2m1_decode_all_codes(torchao_mx) -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    values = e2m1_to_float(codes)
    assert values.tolist() == list(E2M1_VALUES)
    assert torch.equal(torch.signbit(values), codes >= 8)
    assert torch.equal(values, torchao_mx["kernels"].f4_unpacked_to_f32(codes))
    assert torch.equal(float_to_e2m1(values), codes)  # every code round-trips, -0 included


def test_fp4_packing_even_index_in_low_nibble(torchao_mx) -> None:
    codes = torch.tensor([[1, 2, 3, 4, 15, 0]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x0F]]
    assert torch.equal(unpack_fp4(packed), codes)
    assert torch.equal(packed, torchao_mx["kernels"].pack_uint4(codes))
    assert fp4_packed_to_float(packed).tolist() == [[0.5, 1.0, 1.5, 2.0, -6.0, 0.0]]


def test_fp4_pack_roundtrip_random_and_errors() -> None:
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (3, 5, 64), dtype=torch.uint8, generator=g)
    assert torch.equal(unpack_fp4(pack_fp4(codes)), codes)
    assert torch.equal(fp4_packed_to_float(pack_fp4(codes)), e2m1_to_float(codes))
    with pytest.raises(ValueError, match="must be even"):
        pack_fp4(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(TypeError):
        pack_fp4(torch.zeros(4))


def _fp8_grid(dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    finite = values[torch.isfinite(values) & ~torch.signbit(values)]
    grid = finite.unique()  # sorted, 0 first; consecutive codes alternate even/odd mantissa
    return grid, float(grid.max())


@pytest.mark.parametrize("dtype,convert", [(torch.float8_e4m3fn, to_e4m3), (torch.float8_e5m2, to_e5m2)])
def test_fp8_rne_saturating_against_brute_force(dtype, convert) -> None:
    grid, max_value = _fp8_grid(dtype)
    mids = (grid[1:] + grid[:-1]) / 2
    g = torch.Generator().manual_seed(4)
    x = torch.cat([grid, mids, mids.nextafter(torch.zeros_like(mids)),
                   torch.tensor([max_value * 1.04, max_value * 1.1, 1e30, math.inf]),
                   torch.randn(5000, generator=g) * max_value / 8])
    x = torch.cat([x, -x])
    idx = _nearest_even_reference(x, grid, max_value)
    expect = grid[idx] * torch.where(torch.signbit(x), -1.0, 1.0)
    got = convert(x)
    assert got.dtype == dtype
    assert torch.equal(got.float(), expect)
    assert torch.equal(torch.signbit(got.float()), torch.signbit(x))


def test_fp8_hand_values() -> None:
    x = torch.tensor([500.0, 464.0, -1e9, math.inf, 1.0625, 1.1875, 2.0**-10, 1.5 * 2.0**-10])
    assert to_e4m3(x).float().tolist() == [448.0, 448.0, -448.0, 448.0, 1.0, 1.25, 0.0, 2.0**-9]
    assert to_e4m3(torch.tensor([1.0])).view(torch.uint8).item() == 0x38
    assert to_e5m2(torch.tensor([1e6, -math.inf, 57344.0])).view(torch.uint8).tolist() == [0x7B, 0xFB, 0x7B]
    assert torch.isnan(to_e4m3(torch.tensor([math.nan])).float()).all()
    assert torch.isnan(to_e5m2(torch.tensor([math.nan])).float()).all()
