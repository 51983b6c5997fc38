"""MXFP4 / MXFP8: bit-exact against torchao's to_mx on random data and edge blocks, the
documented conventions where torchao differs on purpose, hand-computed bytes, round trips."""
from __future__ import annotations

import math

import pytest
import torch

from kernelslot.formats import dequantize_mx, quantize_mx

ELEMS = {
    "fp4": torch.float4_e2m1fn_x2,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
MODES = {"floor": "FLOOR", "ceil": "CEIL", "rne": "EVEN"}


def _torchao(torchao_mx, x, elem, mode="floor"):
    mode_enum = getattr(torchao_mx["ScaleCalculationMode"], MODES[mode])
    scales, data = torchao_mx["mx_tensor"].to_mx(x.contiguous(), ELEMS[elem], 32, mode_enum)
    return data.view(torch.uint8), scales.view(torch.uint8)


@pytest.mark.parametrize("elem", list(ELEMS))
@pytest.mark.parametrize("mode", list(MODES))
def test_random_bit_exact_vs_torchao(torchao_mx, wide_randn, elem, mode) -> None:
    x = wide_randn(2, 24, 256, seed=10)
    data, scales = quantize_mx(x, elem, mode)
    t_data, t_scales = _torchao(torchao_mx, x, elem, mode)
    assert scales.shape == (2, 24, 8) and scales.dtype == torch.uint8
    assert data.shape == ((2, 24, 128) if elem == "fp4" else (2, 24, 256)) and data.dtype == torch.uint8
    assert torch.equal(scales, t_scales)
    assert torch.equal(data, t_data)


@pytest.mark.parametrize("elem", list(ELEMS))
def test_bf16_input_bit_exact_vs_torchao(torchao_mx, wide_randn, elem) -> None:
    x = wide_randn(16, 128, seed=11).to(torch.bfloat16)
    data, scales = quantize_mx(x, elem)
    t_data, t_scales = _torchao(torchao_mx, x, elem)
    assert torch.equal(scales, t_scales) and torch.equal(data, t_data)


def _edge_rows(elem_max: float) -> torch.Tensor:
    """One 32-element block per row: zeros, exact ties, saturation, tiny normals."""
    g = torch.Generator().manual_seed(12)
    rows = [
        torch.zeros(32),
        torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 4),  # E2M1 ties at scale 1
        torch.tensor([7.9, -7.0, 6.5, 1.0] * 8),  # beyond the FP4 max under floor scaling
        torch.full((32,), elem_max) * torch.tensor([1.0, -1.0] * 16),
        torch.full((32,), elem_max * 1.99),  # mantissa beyond the element max -> saturates
        torch.randn(32, generator=g) * 2.0**-100,  # tiny but normal fp32
        torch.tensor([3.4e38, -3.4e38] + [1.0] * 30),  # near fp32 max
    ]
    return torch.stack(rows)


@pytest.mark.parametrize("elem,elem_max", [("fp4", 6.0), ("fp8_e4m3", 448.0), ("fp8_e5m2", 57344.0)])
@pytest.mark.parametrize("mode", list(MODES))
def test_edge_blocks_bit_exact_vs_torchao(torchao_mx, elem, elem_max, mode) -> None:
    x = _edge_rows(elem_max)
    data, scales = quantize_mx(x, elem, mode)
    t_data, t_scales = _torchao(torchao_mx, x, elem, mode)
    assert torch.equal(scales, t_scales)
    assert torch.equal(data, t_data)
    assert scales[0].item() == 0 and int(data[0].abs().sum()) == 0  # zero block: byte 0, zero codes


def test_hand_computed_fp4_block() -> None:
    x = torch.zeros(1, 32)
    x[0, :6] = torch.tensor([1.0, -0.5, 3.0, 6.0, 2.5, 7.0])
    data, scales = quantize_mx(x, "fp4")
    # amax 7 -> floor(log2 7) - 2 = 0 -> byte 127; codes 2, 9, 5, 7, 4 (2.5 ties to 2), 7 (sat)
    assert scales.tolist() == [[127]]
    assert data[0, :3].tolist() == [0x92, 0x75, 0x74]
    assert int(data[0, 3:].sum()) == 0


def test_hand_computed_fp8_blocks() -> None:
    x = torch.zeros(2, 32)
    x[0, :3] = torch.tensor([1.0, 0.5, -0.375])  # amax 1 -> 2^(0-8), elements x * 256
    x[1, :2] = torch.tensor([1000.0, 3.0])  # amax 1000 -> 2^(9-15) for E5M2
    data, scales = quantize_mx(x[:1], "fp8_e4m3")
    assert scales.tolist() == [[119]]
    assert data[0, :3].tolist() == [0x78, 0x70, 0xEC]  # 256, 128, -96
    data, scales = quantize_mx(x[1:], "fp8_e5m2")
    assert scales.tolist() == [[121]]  # 2^-6
    assert data[0, :2].tolist() == [0x7B, 0x5A]  # 1000*64 saturates to 57344; 3*64 = 192
    assert dequantize_mx(data, scales, "fp8_e5m2")[0, :2].tolist() == [896.0, 3.0]


@pytest.mark.parametrize("elem", list(ELEMS))
def test_nan_and_inf_blocks_follow_formats_md(elem) -> None:
    x = torch.ones(3, 64)
    x[0, 5] = math.nan
    x[1, 40] = -math.inf
    x[2, 7] = math.inf
    x[2, 8] = math.nan
    data, scales = quantize_mx(x, elem)
    ones_scale = quantize_mx(torch.ones(1, 32), elem)[1].item()
    assert scales.tolist() == [[255, ones_scale], [ones_scale, 255], [255, ones_scale]]
    nan_byte = 0x00 if elem == "fp4" else 0x7F
    per_block = 16 if elem == "fp4" else 32
    assert (data[0, :per_block] == nan_byte).all() and (data[1, per_block:] == nan_byte).all()
    y = dequantize_mx(data, scales, elem)
    assert torch.isnan(y[0, :32]).all() and torch.isnan(y[1, 32:]).all() and torch.isnan(y[2, :32]).all()
    assert torch.equal(y[0, 32:], torch.ones(32)) and torch.equal(y[1, :32], torch.ones(32))


@pytest.mark.parametrize("elem", ["fp8_e4m3", "fp8_e5m2"])
def test_scale_byte_zero_means_two_to_minus_127(torchao_mx, elem) -> None:
    """Documented difference: torchao divides by 2^-126 when the scale byte is 0; we use the
    byte's value 2^-127 (FORMATS.md), so subnormal inputs keep one more bit."""
    x = torch.zeros(1, 32)
    x[0, 0] = 2.0**-133
    data, scales = quantize_mx(x, elem)
    assert scales.tolist() == [[0]]
    assert data.view(torch.float8_e4m3fn if elem == "fp8_e4m3" else torch.float8_e5m2)[0, 0].float().item() == 2.0**-6
    assert dequantize_mx(data, scales, elem)[0, 0].item() == 2.0**-133
    t_data, _ = _torchao(torchao_mx, x, elem)
    assert t_data[0, 0].item() != data[0, 0].item()


@pytest.mark.parametrize("elem", list(ELEMS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_matches_torchao(torchao_mx, wide_randn, elem, dtype) -> None:
    x = wide_randn(8, 128, seed=13)
    data, scales = quantize_mx(x, elem)
    t_scales, t_data = torchao_mx["mx_tensor"].to_mx(x, ELEMS[elem], 32)
    theirs = torchao_mx["mx_tensor"].to_dtype(t_data, t_scales, ELEMS[elem], 32, dtype)
    assert torch.equal(dequantize_mx(data, scales, elem, dtype), theirs)


@pytest.mark.parametrize("elem", list(ELEMS))
def test_round_trip_is_idempotent_and_close(wide_randn, elem) -> None:
    x = wide_randn(4, 3, 96, seed=14)
    data, scales = quantize_mx(x, elem)
    y = dequantize_mx(data, scales, elem)
    data2, scales2 = quantize_mx(y, elem)
    assert torch.equal(data2, data) and torch.equal(scales2, scales)
    assert torch.equal(dequantize_mx(data2, scales2, elem), y)
    rel = ((y - x).norm() / x.norm()).item()
    assert rel < {"fp4": 0.2, "fp8_e4m3": 0.05, "fp8_e5m2": 0.1}[elem]


def test_dequantize_accepts_torch_dtypes() -> None:
    x = torch.randn(2, 64)
    data, scales = quantize_mx(x, "fp8_e4m3")
    a = dequantize_mx(data, scales, "fp8_e4m3")
    b = dequantize_mx(data.view(torch.float8_e4m3fn), scales.view(torch.float8_e8m0fnu), "fp8_e4m3")
    assert torch.equal(a, b)


def test_bad_shapes_and_names() -> None:
    with pytest.raises(ValueError, match=r"\(4, 48\).*multiple of 32"):
        quantize_mx(torch.zeros(4, 48), "fp8_e4m3")
    with pytest.raises(ValueError, match="unknown MX element"):
        quantize_mx(torch.zeros(4, 32), "int8")
    with pytest.raises(ValueError, match="unknown E8M0 scale mode"):
        quantize_mx(torch.zeros(4, 32), "fp4", "nearest")
    data, scales = quantize_mx(torch.zeros(4, 64), "fp4")
    with pytest.raises(ValueError, match="scales shape"):
        dequantize_mx(data, scales[:, :1], "fp4")
    with pytest.raises(ValueError, match="multiple of 32"):
        dequantize_mx(data[:, :8], scales[:, :1], "fp4")


@pytest.mark.parametrize("elem", list(ELEMS))
def test_inf_block_scale_differs_from_torchao_on_purpose(torchao_mx, elem) -> None:
    """Documented difference: FORMATS.md makes an inf amax a NaN scale (0xFF); torchao's FLOOR
    derives a finite scale from inf's exponent field."""
    x = torch.ones(1, 32)
    x[0, 3] = math.inf
    _, scales = quantize_mx(x, elem)
    _, t_scales = _torchao(torchao_mx, x, elem)
    assert scales.item() == 0xFF and t_scales.item() != 0xFF
