"""The cuBLAS / CUTLASS "128x4 blocked" scale-factor layout (NVFP4 and MX GEMM operands).

A scale matrix of shape (rows, cols) (one scale per row of the GEMM operand and per
16- or 32-element block of its reduction dim) is zero-padded to (R, C) with R a multiple
of 128 and C a multiple of 4, and cut into 128x4 tiles. Tiles are stored one after the
other, row-of-tiles major (tile ``(i, j)`` is tile number ``i * C/4 + j``), 512 entries
each. Within a tile, entry ``(r, c)`` with ``r = 32*r0 + r1`` (r0 in 0..3, r1 in 0..31)
sits at offset ``r1*16 + r0*4 + c``.

The swizzled tensor keeps the padded 2-D shape (R, C) — the flat memory order is the
layout above — as SGLang and vLLM keep ``w13_weight_scale``. A leading expert dim is
handled per matrix: (E, rows, cols) -> (E, R, C). Any dtype works (E4M3 and E8M0 scales
are 1-byte); padding entries are zero bytes.
"""
from __future__ import annotations

import torch

TILE_ROWS = 128
TILE_COLS = 4


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def swizzled_shape(rows: int, cols: int) -> tuple[int, int]:
    """Padded (R, C) of the swizzled form of a (rows, cols) scale matrix."""
    return _round_up(rows, TILE_ROWS), _round_up(cols, TILE_COLS)


def _as_matrices(t: torch.Tensor, fn: str) -> torch.Tensor:
    if t.dim() not in (2, 3):
        raise ValueError(
            f"{fn}: expected a (rows, cols) or (experts, rows, cols) scale tensor, "
            f"got shape {tuple(t.shape)}"
        )
    return t if t.dim() == 3 else t.unsqueeze(0)


def swizzle_scales_128x4(scales: torch.Tensor) -> torch.Tensor:
    """(rows, cols) or (E, rows, cols) scales -> swizzled (R, C) or (E, R, C), R = pad128(rows),
    C = pad4(cols); same dtype, contiguous."""
    mats = _as_matrices(scales, "swizzle_scales_128x4")
    e, rows, cols = mats.shape
    r_pad, c_pad = swizzled_shape(rows, cols)
    padded = torch.zeros((e, r_pad, c_pad), dtype=scales.dtype, device=scales.device)
    padded[:, :rows, :cols] = mats
    # (e, i, r0, r1, j, c) -> (e, i, j, r1, r0, c): tile (i, j), offset r1*16 + r0*4 + c
    tiles = padded.view(e, r_pad // TILE_ROWS, 4, 32, c_pad // TILE_COLS, TILE_COLS)
    swizzled = tiles.permute(0, 1, 4, 3, 2, 5).contiguous().view(e, r_pad, c_pad)
    return swizzled if scales.dim() == 3 else swizzled[0]


def unswizzle_scales_128x4(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_scales_128x4`: swizzled (R, C) or (E, R, C) -> the logical
    (rows, cols) or (E, rows, cols) matrix (padding dropped), contiguous."""
    mats = _as_matrices(swizzled, "unswizzle_scales_128x4")
    e = mats.shape[0]
    r_pad, c_pad = swizzled_shape(rows, cols)
    if tuple(mats.shape[1:]) != (r_pad, c_pad):
        raise ValueError(
            f"unswizzle_scales_128x4: a ({rows}, {cols}) scale matrix swizzles to "
            f"({r_pad}, {c_pad}) (rows padded to {TILE_ROWS}, cols to {TILE_COLS}), "
            f"got shape {tuple(swizzled.shape)}"
        )
    tiles = mats.contiguous().view(e, r_pad // TILE_ROWS, c_pad // TILE_COLS, 32, 4, TILE_COLS)
    logical = tiles.permute(0, 1, 4, 3, 2, 5).reshape(e, r_pad, c_pad)[:, :rows, :cols]
    logical = logical.contiguous()
    return logical if swizzled.dim() == 3 else logical[0]
