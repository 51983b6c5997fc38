"""E8M0 scale bytes: the floor / ceil / rne rules, special values, and decoding."""
from __future__ import annotations

import math

import pytest
import torch

from kernelslot.formats import E2M1, E4M3, E5M2, e8m0_from_amax, e8m0_reciprocal_float32, e8m0_to_float32


def _bytes(values, fmt, mode="floor"):
    amax = torch.tensor(values, dtype=torch.float32)
    return e8m0_from_amax(amax, emax=fmt.emax, mbits=fmt.mbits, mode=mode).tolist()


def test_floor_hand_values() -> None:
    # floor(log2(amax)) - emax + 127
    assert _bytes([1.0, 6.0, 7.99, 8.0, 0.75], E2M1) == [125, 127, 127, 128, 124]
    assert _bytes([1.0, 448.0, 480.0], E4M3) == [119, 127, 127]
    assert _bytes([1.0, 57344.0], E5M2) == [112, 127]
    # largest finite amax: 127 - 2 + 127; subnormal and tiny amax clamp to byte 0
    assert _bytes([3.4e38, 2.0**-130, 2.0**-126, 2.0**-120], E2M1) == [252, 0, 0, 5]


def test_special_amax_values_every_mode() -> None:
    for mode in ("floor", "ceil", "rne"):
        for fmt in (E2M1, E4M3, E5M2):
            assert _bytes([0.0, math.nan, math.inf, -math.inf], fmt, mode) == [0, 255, 255, 255]


def test_ceil_hand_values() -> None:
    # ceil(log2(amax)) - emax + 127
    assert _bytes([6.0, 4.0, 4.0000005, 2.0**-140], E2M1, "ceil") == [128, 127, 128, 0]
    assert _bytes([448.0, 256.0], E4M3, "ceil") == [128, 127]


def test_rne_rounds_amax_to_element_precision_first() -> None:
    # E2M1 (1 mantissa bit): 7.0 = 1.75*4 ties up to 8 -> next exponent; 6.9 -> 1.5*4 stays
    assert _bytes([7.0, 6.9, 6.0, 3.5], E2M1, "rne") == [128, 127, 127, 127]
    # E4M3 (3 bits): 480 = 1.875*256 is exact; 496 = 1.9375*256 ties up to 512
    assert _bytes([480.0, 496.0, 495.0], E4M3, "rne") == [127, 128, 127]
    # the largest finite amax rounds past 2^128 and still gives a finite byte
    assert _bytes([3.4028235e38], E2M1, "rne") == [253]


def test_modes_against_torchao(torchao_mx, wide_randn) -> None:
    """torchao's to_mx FLOOR / CEIL / EVEN scale rules on finite data (its inf handling differs,
    see docs/formats.md)."""
    mode_map = {"floor": "FLOOR", "ceil": "CEIL", "rne": "EVEN"}
    mode_enum = torchao_mx["ScaleCalculationMode"]
    x = wide_randn(8, 512, seed=5)
    x[0, :32] = 0.0
    x[1, :32] = 7.0  # an exact rne tie for E2M1
    for fmt, dtype in ((E2M1, torch.float4_e2m1fn_x2), (E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)):
        amax = x.reshape(8, 16, 32).abs().amax(-1)
        for mode, name in mode_map.items():
            ours = e8m0_from_amax(amax, emax=fmt.emax, mbits=fmt.mbits, mode=mode)
            theirs, _ = torchao_mx["mx_tensor"].to_mx(x, dtype, 32, getattr(mode_enum, name))
            assert torch.equal(ours, theirs.view(torch.uint8)), (fmt.name, mode)


def test_decode_and_reciprocal_are_exact_powers_of_two() -> None:
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    scale = e8m0_to_float32(b)
    recip = e8m0_reciprocal_float32(b)
    for i in range(255):
        assert scale[i].item() == math.ldexp(1.0, i - 127)
        assert recip[i].item() == math.ldexp(1.0, 127 - i)
    assert math.isnan(scale[255].item()) and math.isnan(recip[255].item())
    assert scale[0].item() == 2.0**-127 and scale[0].item() > 0  # byte 0 is not zero
    # PyTorch's own float8_e8m0fnu decode agrees on every byte
    torch_decode = b.view(torch.float8_e8m0fnu).float()
    assert torch.equal(scale[:255], torch_decode[:255]) and torch.isnan(torch_decode[255])
    from_view = e8m0_to_float32(b.view(torch.float8_e8m0fnu))
    assert torch.equal(from_view[:255], scale[:255]) and torch.isnan(from_view[255])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown E8M0 scale mode"):
        e8m0_from_amax(torch.ones(1), emax=2, mbits=1, mode="nearest")
    with pytest.raises(TypeError):
        e8m0_to_float32(torch.ones(2))
