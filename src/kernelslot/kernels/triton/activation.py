"""Triton ``activation.silu_and_mul``: ``out = silu(x[..., :d]) * x[..., d:]``.

Layout: ``x (..., 2d)`` gate half then up half along the last dim; ``out (..., d)``; any strides,
each tensor indexed through its own (a padded or non-viewable 3-D ``out`` is written in place,
never reshaped). One program per (row, ``BLOCK_D`` columns); rows are the leading dims (two in a
launch; more are split by the launcher). Math in fp32, ``silu(g) = g·σ(g)``, stored rounded to
``out.dtype`` to nearest even (:func:`._common.to_output`). No state across calls; graph-safe.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelslot.kernels.triton._common import lead_dims, pow2, to_output

__all__ = ["silu_and_mul"]

BLOCK_D = 1024  # columns per program at most


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, d, lead1, x_s0, x_s1, x_sc, o_s0, o_s1, o_sc, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < d
    i0 = (row // lead1).to(tl.int64)
    i1 = (row % lead1).to(tl.int64)
    x_row = x_ptr + i0 * x_s0 + i1 * x_s1
    gate = tl.load(x_row + cols * x_sc, mask=keep, other=0.0).to(tl.float32)
    up = tl.load(x_row + (cols + d) * x_sc, mask=keep, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + i0 * o_s0 + i1 * o_s1 + cols * o_sc, to_output(y, out_ptr.dtype.element_ty), mask=keep)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    """Write ``silu(x[..., :d]) * x[..., d:]`` into ``out`` (``x (..., 2d)``, ``out (..., d)``); returns None."""
    d = x.shape[-1] // 2
    if x.shape[-1] != 2 * d or tuple(out.shape) != (*x.shape[:-1], d):
        raise ValueError(f"silu_and_mul: x (..., 2d) and out (..., d) expected, got {tuple(x.shape)} and "
                         f"{tuple(out.shape)}")
    if x.dim() > 3:  # split the outermost dim: views, no copies
        for i in range(x.shape[0]):
            silu_and_mul(x[i], out[i])
        return
    if out.numel() == 0:
        return
    l0, l1, x_s0, x_s1 = lead_dims(x)
    _, _, o_s0, o_s1 = lead_dims(out)
    block = min(pow2(d, 16), BLOCK_D)
    _silu_and_mul_kernel[(l0 * l1, triton.cdiv(d, block))](
        x, out, d, l1, x_s0, x_s1, x.stride(-1), o_s0, o_s1, out.stride(-1), BLOCK=block)
