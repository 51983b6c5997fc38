"""NVFP4: scales bit-exact against torchao, elements bit-exact except where the two libraries'
fp32 division orders may legitimately round across an E2M1 boundary, hand-computed blocks,
the zero/saturation conventions and round trips."""
from __future__ import annotations

import math

import pytest
import torch

from kernelslot.formats import (
    E2M1_VALUES,
    dequantize_nvfp4,
    nvfp4_per_tensor_scale,
    quantize_nvfp4,
    swizzle_scales_128x4,
    unpack_fp4,
)

_E2M1_BOUNDARIES = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)


def _near_boundary(x: torch.Tensor, block_scales: torch.Tensor, per_tensor: torch.Tensor) -> torch.Tensor:
    """Elements whose exact quotient x / (block_scale * per_tensor) lies within 8 fp32 ulps of
    an E2M1 rounding boundary: there our x / fp32(bs*pt) and torchao's x * ((1/pt)/bs) may round
    to neighbouring codes."""
    denom = block_scales.double() * per_tensor.double()
    q = (x.double().reshape(*block_scales.shape, 16) / denom.unsqueeze(-1)).abs()
    rel = ((q.unsqueeze(-1) - _E2M1_BOUNDARIES).abs() / _E2M1_BOUNDARIES).min(-1).values
    return (rel < 8 * 2.0**-24).reshape(x.shape)


@pytest.mark.parametrize("given_scale", [False, True])
def test_random_matches_torchao(torchao_mx, wide_randn, given_scale) -> None:
    x = wide_randn(64, 512, seed=20)
    pt = torch.tensor(0.37) if given_scale else None
    data, block_scales, per_tensor = quantize_nvfp4(x, pt)
    assert data.shape == (64, 256) and data.dtype == torch.uint8
    assert block_scales.shape == (64, 32) and block_scales.dtype == torch.float8_e4m3fn
    assert per_tensor.shape == () and per_tensor.dtype == torch.float32
    if not given_scale:
        assert per_tensor.item() == torch.tensor(x.abs().max().item() / 2688.0, dtype=torch.float32).item()
    t_scales, t_data = torchao_mx["nvfp4_tensor"].nvfp4_quantize(x, 16, per_tensor)
    ours_b, theirs_b = block_scales.view(torch.uint8), t_scales.view(torch.uint8)
    # Scales: identical where ours is an E4M3 normal; below 2^-6 torchao clamps to 2^-6 (0x08)
    # while we keep the E4M3 subnormal (or 0) the cast gives -- a documented difference.
    normal = block_scales.float() >= 2.0**-6
    assert 0 < int(normal.sum()) < normal.numel()  # the data exercises both cases
    assert torch.equal(ours_b[normal], theirs_b[normal])
    assert (theirs_b[~normal] == 0x08).all() and (ours_b[~normal] < 0x08).all()
    codes, t_codes = unpack_fp4(data), unpack_fp4(t_data)
    exempt = _near_boundary(x, block_scales.float(), per_tensor) | ~normal.repeat_interleave(16, -1)
    assert torch.equal(codes[~exempt], t_codes[~exempt])
    assert (exempt & normal.repeat_interleave(16, -1)).float().mean().item() < 0.01


def test_hand_computed_blocks() -> None:
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([12.0, -3.0, 1.0, 5.0])  # block amax 12
    x[0, 16:18] = torch.tensor([0.75, -0.25])  # block amax 0.75
    data, block_scales, per_tensor = quantize_nvfp4(x, per_tensor_scale=0.5)
    # block 0: (12/6)/0.5 = 4 -> E4M3 0x48; elements x / 2 -> 6, -1.5, 0.5, 2.5 (ties to 2)
    # block 1: (0.75/6)/0.5 = 0.25 -> E4M3 0x28; elements x / 0.125 -> 6, -2
    assert block_scales.view(torch.uint8).tolist() == [[0x48, 0x28]]
    assert per_tensor.item() == 0.5
    assert data[0, :2].tolist() == [0xB7, 0x41]
    assert data[0, 8].tolist() == 0xC7
    y = dequantize_nvfp4(data, block_scales, per_tensor)
    assert y[0, :4].tolist() == [12.0, -3.0, 1.0, 4.0]
    assert y[0, 16:18].tolist() == [0.75, -0.25]


def test_zero_blocks_and_zero_tensor() -> None:
    x = torch.randn(2, 64)
    x[0, 16:32] = 0.0
    data, block_scales, _ = quantize_nvfp4(x)
    assert block_scales[0, 1].float().item() == 0.0  # documented: torchao would give E4M3 eps
    assert int(data[0, 8:16].sum()) == 0
    data, block_scales, per_tensor = quantize_nvfp4(torch.zeros(3, 32))
    assert per_tensor.item() == 0.0
    assert int(data.sum()) == 0 and int(block_scales.view(torch.uint8).sum()) == 0
    assert torch.equal(dequantize_nvfp4(data, block_scales, per_tensor), torch.zeros(3, 32))


def test_saturation_with_too_small_per_tensor_scale() -> None:
    x = torch.tensor([[1000.0, -1000.0, 10.0] + [0.0] * 13])
    data, block_scales, _ = quantize_nvfp4(x, per_tensor_scale=0.125)
    assert block_scales.float().item() == 448.0  # (1000/6)/0.125 = 1333 saturates
    codes = unpack_fp4(data)[0, :3].tolist()
    assert codes == [7, 15, 0]  # 1000/56 = 17.9 -> 6 ; 10/56 = 0.18 -> 0


def test_dequantize_formula_and_torchao(torchao_mx, wide_randn) -> None:
    x = wide_randn(32, 128, seed=21, spread=3)  # every block scale an E4M3 normal
    data, block_scales, per_tensor = quantize_nvfp4(x)
    values = torch.tensor(E2M1_VALUES)[unpack_fp4(data).long()].reshape(32, 8, 16)
    expect = ((values * block_scales.float().unsqueeze(-1)) * per_tensor).reshape(32, 128)
    y = dequantize_nvfp4(data, block_scales, per_tensor)
    assert torch.equal(y, expect)
    assert torch.equal(dequantize_nvfp4(data, block_scales.view(torch.uint8), per_tensor.item()), y)
    # torchao multiplies e2m1 * fp32(per_tensor * block_scale): equal up to one rounding
    t = torchao_mx["nvfp4_tensor"].NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor).dequantize(torch.float32)
    torch.testing.assert_close(y, t, rtol=2.0**-23, atol=0.0)
    assert ((y - x).norm() / x.norm()).item() < 0.15
    bf16 = dequantize_nvfp4(data, block_scales, per_tensor, torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, y.to(torch.bfloat16))


def test_round_trip_idempotent(wide_randn) -> None:
    x = wide_randn(4, 2, 64, seed=22, spread=3)
    data, block_scales, per_tensor = quantize_nvfp4(x)
    y = dequantize_nvfp4(data, block_scales, per_tensor)
    data2, block_scales2, per_tensor2 = quantize_nvfp4(y, per_tensor)
    assert torch.equal(block_scales2.view(torch.uint8), block_scales.view(torch.uint8))
    assert torch.equal(data2, data)


def test_swizzled_scales_match_torchao_to_nvfp4(torchao_mx) -> None:
    x = torch.randn(200, 96, generator=torch.Generator().manual_seed(23))
    _, block_scales, per_tensor = quantize_nvfp4(x)
    t = torchao_mx["nvfp4_tensor"].NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor, is_swizzled_scales=True)
    ours = swizzle_scales_128x4(block_scales)
    assert torch.equal(ours.view(torch.uint8).flatten(), t.scale.view(torch.uint8).flatten())


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\(2, 24\).*multiple of 16"):
        quantize_nvfp4(torch.zeros(2, 24))
    x = torch.ones(2, 32)
    x[1, 3] = math.inf
    with pytest.raises(ValueError, match=r"non-finite.*\[1, 3\]"):
        quantize_nvfp4(x)
    with pytest.raises(ValueError, match="positive and finite"):
        quantize_nvfp4(torch.ones(2, 32), per_tensor_scale=0.0)
    with pytest.raises(ValueError, match="scalar"):
        quantize_nvfp4(torch.ones(2, 32), per_tensor_scale=torch.ones(2))
    data, block_scales, per_tensor = quantize_nvfp4(torch.ones(2, 32))
    with pytest.raises(ValueError, match="unswizzle"):
        dequantize_nvfp4(data, swizzle_scales_128x4(block_scales), per_tensor)
    assert nvfp4_per_tensor_scale(torch.full((2, 16), -2688.0)).item() == 1.0


@pytest.mark.parametrize("per_tensor,amax", [(0.3, 5.0), (0.3, 3.0), (0.77, 1.1)])
def test_elements_divide_by_the_fp32_product_exactly(per_tensor, amax) -> None:
    """Pin FORMATS.md's x / fp32(block_scale * per_tensor): values one ulp either side of the
    0.25 tie (exactly 0.25·d, with d that product) must land on their own side. (torchao's
    x * ((1/pt)/bs) puts the upper one on the tie for the last two cases.)"""
    pt = torch.tensor(per_tensor)
    block = torch.zeros(1, 16)
    block[0, 0] = amax
    _, block_scales, _ = quantize_nvfp4(block, pt)
    d = (block_scales.float() * pt).reshape(())
    tie = d * 0.25  # exact: a power-of-two multiple
    block[0, 1:4] = torch.stack([tie.nextafter(torch.tensor(1.0)), tie, tie.nextafter(torch.tensor(0.0))])
    data, block_scales2, _ = quantize_nvfp4(block, pt)
    assert torch.equal(block_scales2.view(torch.uint8), block_scales.view(torch.uint8))
    assert unpack_fp4(data)[0, 1:4].tolist() == [1, 0, 0]


def test_outer_scale_per_slice_and_validation() -> None:
    from kernelslot.formats import quantize_nvfp4_blocks

    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(24))
    outer = nvfp4_per_tensor_scale(x, dim=(1, 2))
    data, block_scales = quantize_nvfp4_blocks(x, outer.view(2, 1, 1))
    for e in range(2):
        d, bs, pt = quantize_nvfp4(x[e])
        assert pt.item() == outer[e].item()
        assert torch.equal(data[e], d) and torch.equal(block_scales[e].view(torch.uint8), bs.view(torch.uint8))
    with pytest.raises(ValueError, match="finite and >= 0"):
        quantize_nvfp4_blocks(x, torch.tensor(-1.0))
    given = torch.tensor(0.5)
    assert quantize_nvfp4(x, given)[2].data_ptr() != given.data_ptr()
