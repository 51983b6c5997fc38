"""Triton ``norm.rmsnorm``: ``out = x·rsqrt(mean(x², -1) + eps)·weight``.

Layout: ``x (..., H)``, ``weight (H,)``, ``out (..., H)``; any strides, each tensor indexed through
its own (``out``'s padded rows are written through ``out``'s row stride, never ``x``'s). One program
per row: a first pass over ``BLOCK_H`` chunks sums ``x²`` in fp32, a second writes the normalised
row, rounded to ``out.dtype`` to nearest even. Gemma-style ``(1 + w)`` models pass ``1 + w`` as
``weight`` (the ``gemma_one_plus_w`` profile): the kernel multiplies by ``weight`` as given. No
state across calls; graph-safe.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelslot.kernels.triton._common import lead_dims, pow2, to_output

__all__ = ["rmsnorm"]

BLOCK_H = 2048  # columns per chunk at most


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, hidden, eps, lead1, x_s0, x_s1, x_sc, w_s, o_s0, o_s1, o_sc,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0)
    i0 = (row // lead1).to(tl.int64)
    i1 = (row % lead1).to(tl.int64)
    x_row = x_ptr + i0 * x_s0 + i1 * x_s1
    o_row = out_ptr + i0 * o_s0 + i1 * o_s1
    squares = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, hidden, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(x_row + cols * x_sc, mask=cols < hidden, other=0.0).to(tl.float32)
        squares += v * v
    inv_rms = tl.rsqrt(tl.sum(squares, axis=0) / hidden + eps)
    for start in range(0, hidden, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        keep = cols < hidden
        v = tl.load(x_row + cols * x_sc, mask=keep, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * w_s, mask=keep, other=0.0).to(tl.float32)
        tl.store(o_row + cols * o_sc, to_output(v * inv_rms * w, out_ptr.dtype.element_ty), mask=keep)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float) -> None:
    """Write the RMSNorm of each row of ``x`` times ``weight`` into ``out`` (fp32 math); returns None."""
    hidden = x.shape[-1]
    if tuple(weight.shape) != (hidden,) or out.shape != x.shape:
        raise ValueError(f"rmsnorm: x (..., H), weight (H,) and out like x expected, got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)} and {tuple(out.shape)}")
    if x.dim() > 3:  # split the outermost dim: views, no copies
        for i in range(x.shape[0]):
            rmsnorm(x[i], weight, out[i], eps)
        return
    if out.numel() == 0:
        return
    l0, l1, x_s0, x_s1 = lead_dims(x)
    _, _, o_s0, o_s1 = lead_dims(out)
    _rmsnorm_kernel[(l0 * l1,)](x, weight, out, hidden, float(eps), l1, x_s0, x_s1, x.stride(-1), weight.stride(0),
                                o_s0, o_s1, out.stride(-1), BLOCK=min(pow2(hidden, 16), BLOCK_H))
