"""E8M0 block scales (OCP MX v1.0 ``float8_e8m0fnu``), built as raw ``uint8`` bytes.

Encoding: byte ``b`` in 0..254 is the power of two ``2^(b-127)`` (byte 0 is ``2^-127``, a
subnormal fp32, not zero); byte 0xFF is NaN. There is no zero, sign or infinity. The bytes
are computed with integer arithmetic on the fp32 bit pattern of the block amax: PyTorch's
fp32 -> ``float8_e8m0fnu`` cast rounds to nearest, which is not the MX scale rule.

Scale exponent from a block amax and the element type's ``emax`` (2 for E2M1, 8 for E4M3,
15 for E5M2), clamped to [-127, 127]:

- ``"floor"`` (default, docs/formats.md): ``floor(log2(amax)) - emax``.
- ``"ceil"``: ``ceil(log2(amax)) - emax`` (no element ever saturates).
- ``"rne"``: ``floor(log2(rne(amax))) - emax`` where ``rne`` rounds amax to the element's
  mantissa width (``mbits``) with ties to even first, so a block whose amax would round up
  to the next power of two in the element format gets that larger scale
  (torchao's ``ScaleCalculationMode.EVEN``).

Special amax values, for every mode: ``amax == 0`` -> byte 0; NaN or ±inf amax -> 0xFF.
"""
from __future__ import annotations

from typing import Literal

import torch

ScaleMode = Literal["floor", "ceil", "rne"]
SCALE_MODES: tuple[str, ...] = ("floor", "ceil", "rne")

E8M0_BIAS = 127
E8M0_NAN = 0xFF
_F32_MANTISSA_BITS = 23
_F32_MANTISSA_MASK = (1 << _F32_MANTISSA_BITS) - 1
_F32_TWO_POW_MINUS_127_BITS = 0x00400000  # 2^-127 as an fp32 (subnormal) bit pattern
_F32_QUIET_NAN_BITS = 0x7FC00000


def e8m0_from_amax(
    amax: torch.Tensor, *, emax: int, mbits: int, mode: ScaleMode = "floor"
) -> torch.Tensor:
    """Block amax (any float dtype, non-negative) -> E8M0 scale bytes (``uint8``, same shape).

    ``emax``/``mbits`` describe the element type (see module docstring); ``mbits`` is used
    only by ``mode="rne"``.
    """
    if mode not in SCALE_MODES:
        raise ValueError(f"unknown E8M0 scale mode {mode!r}; allowed: {SCALE_MODES}")
    if not amax.is_floating_point():
        raise TypeError(f"e8m0_from_amax: amax must be floating point, got {amax.dtype}")
    amax32 = amax.float()
    bits = amax32.view(torch.int32) & 0x7FFFFFFF  # |amax|: ignore a stray sign bit
    if mode == "rne":
        # Round to `mbits` mantissa bits, ties to even, and keep only the exponent. The
        # exponent of the rounded value equals the exponent of the half-up rounding (the
        # only tie that carries is all-ones -> next power of two, which is the even side).
        bits = bits + (1 << (_F32_MANTISSA_BITS - mbits - 1))
    exponent_field = bits >> _F32_MANTISSA_BITS  # biased fp32 exponent, 0 for zero/subnormal
    if mode == "ceil":
        exponent_field = exponent_field + ((bits & _F32_MANTISSA_MASK) != 0).to(torch.int32)
    # floor(log2(amax)) = exponent_field - 127 for normal amax; subnormal amax has
    # floor(log2) < -126, which clamps to the same byte 0 because emax >= 1.
    biased = (exponent_field - emax).clamp(0, 2 * E8M0_BIAS)
    biased = torch.where(torch.isfinite(amax32), biased, E8M0_NAN)
    return biased.to(torch.uint8)


def e8m0_to_float32(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (``uint8`` or ``float8_e8m0fnu``) -> fp32 ``2^(b-127)``; 0xFF -> NaN."""
    b = _as_bytes(scales).to(torch.int32)
    bits = torch.where(b == 0, _F32_TWO_POW_MINUS_127_BITS, b << _F32_MANTISSA_BITS)
    bits = torch.where(b == E8M0_NAN, _F32_QUIET_NAN_BITS, bits)
    return bits.view(torch.float32)


def e8m0_reciprocal_float32(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> fp32 ``2^(127-b)``, exactly ``1/scale`` (every such power is an fp32);
    0xFF -> NaN. Multiplying by it equals dividing by the scale, bit for bit."""
    b = _as_bytes(scales).to(torch.int32)
    bits = torch.where(
        b == 2 * E8M0_BIAS, _F32_TWO_POW_MINUS_127_BITS, (2 * E8M0_BIAS - b) << _F32_MANTISSA_BITS
    )
    bits = torch.where(b == E8M0_NAN, _F32_QUIET_NAN_BITS, bits)
    return bits.view(torch.float32)


def _as_bytes(scales: torch.Tensor) -> torch.Tensor:
    if scales.dtype == torch.float8_e8m0fnu:
        return scales.view(torch.uint8)
    if scales.dtype != torch.uint8:
        raise TypeError(
            f"E8M0 scales must be uint8 bytes or float8_e8m0fnu, got {scales.dtype}"
        )
    return scales
