"""NVFP4 (NVIDIA / ModelOpt): E2M1 elements, one E4M3 scale per 16 elements along the last
dim, and one fp32 per-tensor scale.

Quantisation (docs/formats.md, every step in fp32):

- ``per_tensor = amax(|x|) / (448 * 6)`` unless the caller supplies it;
- ``block_scale = e4m3((block_amax / 6) / per_tensor)`` — two fp32 divisions, then a
  saturating (±448) round-to-nearest-even cast to ``float8_e4m3fn``;
- ``element = e2m1(x / (fp32(block_scale) * per_tensor))``, saturated to ±6, RNE; the
  denominator is one fp32 product. Where it is zero (an all-zero block, or a block scale
  that underflows E4M3) the elements are code 0: that block dequantises to 0 regardless.

Layout: ``data`` ``uint8`` (..., n/2), codes packed two per byte, even-index element in the
low nibble; ``block_scales`` ``float8_e4m3fn`` (..., n/16) in logical (unswizzled) order — pass
them to :func:`swizzle_scales_128x4` for GEMM kernels; ``per_tensor_scale`` a 0-d fp32 tensor.

Dequantisation: ``fp32(e2m1 * block_scale) * per_tensor`` (the first product is exact), cast
to ``dtype``. Non-finite input is rejected: NVFP4 has no NaN/inf encoding that survives the
per-tensor scale.
"""
from __future__ import annotations

import torch

from .elements import E2M1, E4M3, float_to_e2m1, fp4_packed_to_float, pack_fp4, to_e4m3

NVFP4_BLOCK_SIZE = 16
NVFP4_SCALE_DENOMINATOR = E4M3.max_value * E2M1.max_value  # 448 * 6 = 2688


def _blocks_and_amax(x: torch.Tensor, fn: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate ``x`` and return its fp32 blocks (..., n/16, 16) and their amax (..., n/16)."""
    if not x.is_floating_point():
        raise TypeError(f"{fn}: x must be floating point, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0 or x.shape[-1] % NVFP4_BLOCK_SIZE != 0:
        raise ValueError(
            f"{fn}: shape {tuple(x.shape)}: NVFP4 blocks run along the last dim, which must "
            f"be a positive multiple of {NVFP4_BLOCK_SIZE}; pad it first"
        )
    lead, n = x.shape[:-1], x.shape[-1]
    blocks = x.float().reshape(*lead, n // NVFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE)
    block_amax = blocks.abs().amax(dim=-1)  # NaN propagates, inf stays inf
    if not bool(torch.isfinite(block_amax).all()):
        bad = ~torch.isfinite(x)
        raise ValueError(
            f"{fn}: x has {int(bad.sum())} non-finite value(s) (first at index "
            f"{bad.nonzero()[0].tolist()}); NVFP4 cannot encode NaN/inf — clean the tensor "
            "before quantising"
        )
    return blocks, block_amax


def _encode_blocks(
    blocks: torch.Tensor, block_amax: torch.Tensor, outer: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    wanted = torch.where(outer > 0, (block_amax / E2M1.max_value) / outer, 0.0)
    block_scales = to_e4m3(wanted)
    denominator = block_scales.float() * outer
    zero = denominator == 0
    # x / inf = ±0 keeps the division branch-free; zero-scale blocks are then forced to code 0
    elements = blocks / denominator.masked_fill(zero, float("inf")).unsqueeze(-1)
    codes = float_to_e2m1(elements)
    if bool(zero.any()):
        codes.masked_fill_(zero.unsqueeze(-1), 0)
    *lead, nb, _ = blocks.shape
    return pack_fp4(codes.reshape(*lead, nb * NVFP4_BLOCK_SIZE)), block_scales


def nvfp4_per_tensor_scale(
    x: torch.Tensor, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """The default NVFP4 per-tensor scale ``amax(|x|) / (448*6)`` in fp32: a 0-d tensor, or
    one per slice when ``dim`` names the reduced dims (e.g. ``(1, 2)`` per expert matrix)."""
    a = x.float().abs()
    amax = a.amax() if dim is None else a.amax(dim=dim)
    return amax / NVFP4_SCALE_DENOMINATOR


def quantize_nvfp4_blocks(
    x: torch.Tensor, per_tensor_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Core of :func:`quantize_nvfp4` with an outer scale that broadcasts against the block
    grid (..., n/16) — a 0-d tensor, or e.g. (E, 1, 1) for one scale per expert matrix.

    ``per_tensor_scale`` must be fp32, finite and >= 0 (0 only where that slice of ``x`` is
    all zero). Returns ``(data uint8 (..., n/2), block_scales float8_e4m3fn (..., n/16))``.
    """
    blocks, block_amax = _blocks_and_amax(x, "quantize_nvfp4_blocks")
    outer = per_tensor_scale.float()
    if not bool((torch.isfinite(outer) & (outer >= 0)).all()):
        raise ValueError(
            "quantize_nvfp4_blocks: per_tensor_scale must be finite and >= 0, got "
            f"{outer.flatten()[:8].tolist()}"
        )
    return _encode_blocks(blocks, block_amax, outer)


def quantize_nvfp4(
    x: torch.Tensor, per_tensor_scale: torch.Tensor | float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantise ``x`` (..., n), n a multiple of 16, to NVFP4 along its last dim.

    Returns ``(data, block_scales, per_tensor_scale)``: ``uint8`` (..., n/2) packed E2M1
    (even index in the low nibble), ``float8_e4m3fn`` (..., n/16) unswizzled, 0-d fp32.
    ``per_tensor_scale`` defaults to ``amax/(448*6)``; a given one must be a positive finite
    scalar (values beyond ``448*6*per_tensor`` then saturate).
    """
    blocks, block_amax = _blocks_and_amax(x, "quantize_nvfp4")
    if per_tensor_scale is None:
        # the max of the block maxima is amax(|x|): same value as nvfp4_per_tensor_scale(x)
        amax = block_amax.amax() if block_amax.numel() else torch.zeros((), device=x.device)
        outer = amax / NVFP4_SCALE_DENOMINATOR
    else:
        outer = torch.as_tensor(per_tensor_scale, dtype=torch.float32, device=x.device)
        if outer.numel() != 1:
            raise ValueError(
                f"quantize_nvfp4: per_tensor_scale must be a scalar, got shape {tuple(outer.shape)}"
            )
        outer = outer.reshape(()).clone()  # never alias the caller's tensor
        value = float(outer)
        if not (value > 0.0 and value != float("inf")):
            raise ValueError(
                f"quantize_nvfp4: per_tensor_scale must be positive and finite, got {value}"
            )
    data, block_scales = _encode_blocks(blocks, block_amax, outer)
    return data, block_scales, outer


def dequantize_nvfp4(
    data: torch.Tensor,
    block_scales: torch.Tensor,
    per_tensor_scale: torch.Tensor | float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of :func:`quantize_nvfp4`: ``fp32(e2m1 * block_scale) * per_tensor`` -> ``dtype``.

    ``data`` ``uint8`` (..., n/2); ``block_scales`` unswizzled (..., n/16), ``float8_e4m3fn``
    (or its ``uint8`` bytes); ``per_tensor_scale`` a scalar or a tensor broadcasting against
    the block grid (..., n/16).
    """
    if data.dtype != torch.uint8:
        raise TypeError(f"dequantize_nvfp4: data must be packed uint8, got {data.dtype}")
    if block_scales.dtype == torch.uint8:
        block_scales = block_scales.view(torch.float8_e4m3fn)
    if block_scales.dtype != torch.float8_e4m3fn:
        raise TypeError(
            f"dequantize_nvfp4: block_scales must be float8_e4m3fn, got {block_scales.dtype}"
        )
    n = data.shape[-1] * 2 if data.dim() else 0
    lead = data.shape[:-1]
    expected = (*lead, n // NVFP4_BLOCK_SIZE)
    if n == 0 or n % NVFP4_BLOCK_SIZE != 0 or tuple(block_scales.shape) != expected:
        raise ValueError(
            f"dequantize_nvfp4: data {tuple(data.shape)} (packed, n/2) needs unswizzled "
            f"block_scales of shape {expected} (one E4M3 per {NVFP4_BLOCK_SIZE} elements), "
            f"got {tuple(block_scales.shape)}; unswizzle with unswizzle_scales_128x4 first"
        )
    values = fp4_packed_to_float(data).reshape(*lead, n // NVFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE)
    outer = torch.as_tensor(per_tensor_scale, dtype=torch.float32, device=data.device)
    scaled = values * block_scales.float().unsqueeze(-1)
    out = scaled * (outer.unsqueeze(-1) if outer.dim() else outer)
    return out.reshape(*lead, n).to(dtype)
