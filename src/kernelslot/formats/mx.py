"""MXFP4 / MXFP8 (OCP Microscaling v1.0) along the last dimension, blocks of 32.

Layout (the contract other modules rely on):

- Input ``x`` of shape (..., n), n a multiple of 32; block ``k`` of a row is elements
  ``[32k, 32k+32)``. Any float dtype; computation is in fp32.
- ``scales``: ``uint8`` E8M0 bytes of shape (..., n/32) (view as ``float8_e8m0fnu`` if a
  kernel wants the torch dtype). Scale rule and special values: see :mod:`.e8m0`
  (default ``"floor"``; amax 0 -> byte 0; a block holding NaN or ±inf -> 0xFF).
- ``data``:
  - ``elem="fp4"``: ``uint8`` (..., n/2), E2M1 codes packed two per byte, even-index element
    in the low nibble.
  - ``elem="fp8_e4m3"`` / ``"fp8_e5m2"``: ``uint8`` (..., n), the raw FP8 bytes.
- Elements are ``x / scale`` (computed as ``x * 2^(127-b)``, bit-identical), saturated to the
  element max and rounded to nearest, ties to even.
- A block whose scale is 0xFF (NaN) has all element bytes set to the element type's NaN for
  FP8 (0x7F) and to code 0 for FP4 (E2M1 has no NaN); it dequantises to NaN through its
  scale either way.

``dequantize_mx`` returns ``element * scale`` computed in fp32 (exact: a power-of-two
scaling of a short mantissa) and then cast to ``dtype``.
"""
from __future__ import annotations

from typing import Literal

import torch

from .e8m0 import ScaleMode, e8m0_from_amax, e8m0_reciprocal_float32, e8m0_to_float32
from .elements import (
    E2M1,
    E4M3,
    E5M2,
    ElementFormat,
    float_to_e2m1,
    fp4_packed_to_float,
    pack_fp4,
    to_e4m3,
    to_e5m2,
)

MX_BLOCK_SIZE = 32
MxElement = Literal["fp4", "fp8_e4m3", "fp8_e5m2"]
MX_ELEMENTS: dict[str, ElementFormat] = {"fp4": E2M1, "fp8_e4m3": E4M3, "fp8_e5m2": E5M2}
_FP8_NAN_BYTE = 0x7F  # positive NaN in both float8_e4m3fn and float8_e5m2


def _element_format(elem: str) -> ElementFormat:
    try:
        return MX_ELEMENTS[elem]
    except KeyError:
        raise ValueError(
            f"unknown MX element type {elem!r}; allowed: {tuple(MX_ELEMENTS)}"
        ) from None


def _check_blocked_last_dim(shape: torch.Size, what: str, n: int) -> None:
    if len(shape) == 0 or n % MX_BLOCK_SIZE != 0 or n == 0:
        raise ValueError(
            f"{what}: shape {tuple(shape)} has last dim {n if len(shape) else '(none)'}; "
            f"MX blocks run along the last dim, which must be a positive multiple of "
            f"{MX_BLOCK_SIZE}. Pad the last dim to a multiple of {MX_BLOCK_SIZE} first."
        )


def quantize_mx(
    x: torch.Tensor, elem: MxElement = "fp4", scale_mode: ScaleMode = "floor"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x`` (..., n) to MX along its last dim -> ``(data, scales)``.

    ``data`` is ``uint8`` (..., n/2) for ``"fp4"`` (packed, even index in the low nibble) or
    ``uint8`` (..., n) raw FP8 bytes for ``"fp8_e4m3"``/``"fp8_e5m2"``; ``scales`` is ``uint8``
    E8M0 (..., n/32). Raises ValueError when the last dim is not a multiple of 32.
    """
    fmt = _element_format(elem)
    if not x.is_floating_point():
        raise TypeError(f"quantize_mx: x must be floating point, got {x.dtype}")
    _check_blocked_last_dim(x.shape, "quantize_mx", x.shape[-1] if x.dim() else 0)
    lead, n = x.shape[:-1], x.shape[-1]
    blocks = x.float().reshape(*lead, n // MX_BLOCK_SIZE, MX_BLOCK_SIZE)
    amax = blocks.abs().amax(dim=-1)  # NaN propagates; inf stays inf
    scales = e8m0_from_amax(amax, emax=fmt.emax, mbits=fmt.mbits, mode=scale_mode)
    scaled = blocks * e8m0_reciprocal_float32(scales).unsqueeze(-1)
    nan_block = (scales == 0xFF).unsqueeze(-1)
    has_nan_block = bool(nan_block.any())
    if elem == "fp4":
        codes = float_to_e2m1(scaled)  # saturates at ±6
        if has_nan_block:
            codes.masked_fill_(nan_block, 0)
        return pack_fp4(codes.reshape(*lead, n)), scales
    cast = to_e4m3 if elem == "fp8_e4m3" else to_e5m2
    data = cast(scaled).view(torch.uint8)
    if has_nan_block:
        data.masked_fill_(nan_block, _FP8_NAN_BYTE)
    return data.reshape(*lead, n), scales


def dequantize_mx(
    data: torch.Tensor,
    scales: torch.Tensor,
    elem: MxElement = "fp4",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of :func:`quantize_mx`: ``(data, scales)`` -> values (..., n) in ``dtype``.

    ``data``: ``uint8`` (..., n/2) packed FP4 or (..., n) FP8 bytes (a ``float8_e4m3fn`` /
    ``float8_e5m2`` tensor matching ``elem`` is accepted too); ``scales``: ``uint8`` or
    ``float8_e8m0fnu`` (..., n/32) with the same leading dims.
    """
    _element_format(elem)
    if elem == "fp4":
        if data.dtype != torch.uint8:
            raise TypeError(f"dequantize_mx(fp4): data must be packed uint8, got {data.dtype}")
        n = data.shape[-1] * 2 if data.dim() else 0
        _check_blocked_last_dim(data.shape, "dequantize_mx(fp4) data (packed, n/2)", n)
        values = fp4_packed_to_float(data)
    else:
        fp8_dtype = torch.float8_e4m3fn if elem == "fp8_e4m3" else torch.float8_e5m2
        if data.dtype not in (torch.uint8, fp8_dtype):
            raise TypeError(
                f"dequantize_mx({elem}): data must be uint8 bytes or {fp8_dtype}, got {data.dtype}"
            )
        n = data.shape[-1] if data.dim() else 0
        _check_blocked_last_dim(data.shape, f"dequantize_mx({elem}) data", n)
        values = data.view(fp8_dtype).float()
    lead = data.shape[:-1]
    expected = (*lead, n // MX_BLOCK_SIZE)
    if tuple(scales.shape) != expected:
        raise ValueError(
            f"dequantize_mx: scales shape {tuple(scales.shape)} does not match data shape "
            f"{tuple(data.shape)} ({elem}); expected {expected} (one E8M0 byte per "
            f"{MX_BLOCK_SIZE} elements along the last dim)"
        )
    blocks = values.reshape(*lead, n // MX_BLOCK_SIZE, MX_BLOCK_SIZE)
    out = blocks * e8m0_to_float32(scales).unsqueeze(-1)
    return out.reshape(*lead, n).to(dtype)
