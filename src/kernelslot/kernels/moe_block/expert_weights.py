"""Dequantisation of one local expert's weights to fp32, for every :data:`EXPERT_FORMATS` entry.

The weight side of the format axis of seed 003's 2×2 leaf matrix (seed 003 is the MoE decode
megakernel source document the project was created from,
``../shared/seeds/003_fbad06efb3d9daf3.txt``): the leaves and :mod:`projections` see only fp32
matrices and projections built here, so they are format-agnostic. The codecs themselves live
in :mod:`kernelslot.formats`; this module only applies them per expert.

Dimensions:
    E_L local experts, H hidden, I intermediate, N rows of the input to a projection.

Arguments:
    weights  :class:`ExpertWeights` in the layout of :mod:`kernelslot.kernels.experts_spec`.
    e        the local expert, in [0, E_L).
    which    ``"gate_up"`` | ``"down"`` (:func:`expert_projection`).

Returns:
    :func:`expert_gate_up` fp32 ``(2I, H)`` in the logical row order (gate rows then up rows);
    :func:`expert_down` fp32 ``(H, I)``; :func:`dequantize_experts` both for all experts,
    ``(E_L, 2I, H)`` and ``(E_L, H, I)``; :func:`expert_projection` a callable
    ``x (N, in) fp32 -> x·Wᵀ + b`` fp32 ``(N, out)``; :func:`as_dense` dense fp32 weights.

Pseudocode, per format::

    dense      W = data.float()                                   # a cast
    fp8_row    W = e4m3 · scale[row]          # gate/up scales accepted as (E, 2I) or (E, 2, I)
    mxfp4/8    W = E2M1 / E4M3 · E8M0 block scale                 # 32 along the contraction dim
    nvfp4      W = E2M1 · E4M3 block scale · outer[e]             # 16, unswizzled; outer fp32
    expert_projection(x) = x·Wᵀ (+ bias[e]), W dequantised a block of rows (2²² elements) at a
                           time, so no full fp32 copy of a large expert is materialised; each
                           output element is the same fp32 dot product
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from kernelslot.formats.mx import dequantize_mx
from kernelslot.formats.nvfp4 import dequantize_nvfp4
from kernelslot.kernels.experts_spec import ExpertWeights

_MX_ELEM = {"mxfp4": "fp4", "mxfp8": "fp8_e4m3"}


def _dequantize(weights: ExpertWeights, data: torch.Tensor, scale, outer, e: int, rows: slice = slice(None)) -> torch.Tensor:
    """fp32 rows ``rows`` of one matrix of expert ``e`` (rows are independent in every format)."""
    fmt = weights.format
    if fmt == "dense":
        return data[e, rows].float()
    if fmt == "fp8_row":
        if scale is None:
            raise ValueError("ExpertWeights(format='fp8_row') needs per-row scales for gate_up and down")
        return data[e, rows].float() * scale[e].reshape(-1, 1)[rows].float()
    if fmt in _MX_ELEM:
        return dequantize_mx(data[e, rows], scale[e, rows], _MX_ELEM[fmt], torch.float32)
    if fmt == "nvfp4":
        return dequantize_nvfp4(data[e, rows], scale[e, rows], outer[e].float(), torch.float32)
    raise ValueError(f"unknown expert format {fmt!r}")


def expert_gate_up(weights: ExpertWeights, e: int) -> torch.Tensor:
    """fp32 ``(2I, H)`` gate rows then up rows of local expert ``e``."""
    return _dequantize(weights, weights.gate_up, weights.gate_up_scale, weights.gate_up_outer, e)


def expert_down(weights: ExpertWeights, e: int) -> torch.Tensor:
    """fp32 ``(H, I)`` down projection of local expert ``e``."""
    return _dequantize(weights, weights.down, weights.down_scale, weights.down_outer, e)


CHUNK_ELEMENTS = 1 << 22  # fp32 weight elements dequantised at a time (bounds the temporary to 16 MiB)


def expert_projection(weights: ExpertWeights, e: int, which: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x (N, in) fp32 -> x·Wᵀ + b`` fp32 for ``which`` in ``("gate_up", "down")`` of expert ``e``.

    The weight is dequantised a block of rows at a time, so no full fp32 copy of a large
    expert is ever materialised; each output element is the same fp32 dot product.
    """
    if which == "gate_up":
        data, scale, outer, bias = weights.gate_up, weights.gate_up_scale, weights.gate_up_outer, weights.gate_up_bias
    elif which == "down":
        data, scale, outer, bias = weights.down, weights.down_scale, weights.down_outer, weights.down_bias
    else:
        raise ValueError(f"expert_projection: which={which!r}; allowed: 'gate_up', 'down'")
    n_rows = data.shape[1]
    cols = data.shape[2] * (2 if weights.format in ("mxfp4", "nvfp4") else 1)
    step = max(32, CHUNK_ELEMENTS // cols)

    converts_in_place = weights.format in ("dense", "fp8_row")

    def rows_fp32(rows: slice, scratch: Optional[torch.Tensor]) -> torch.Tensor:
        # dense / FP8-row convert into one reused scratch block (no fresh pages per chunk)
        if weights.format == "dense":
            return scratch[: rows.stop - rows.start].copy_(data[e, rows])
        if weights.format == "fp8_row" and scale is not None:
            block = scratch[: rows.stop - rows.start].copy_(data[e, rows])
            return block.mul_(scale[e].reshape(-1, 1)[rows].float())
        return _dequantize(weights, data, scale, outer, e, rows)

    def project(x: torch.Tensor) -> torch.Tensor:
        if step >= n_rows:
            y = F.linear(x, _dequantize(weights, data, scale, outer, e))
        else:
            y = torch.empty(x.shape[0], n_rows, dtype=torch.float32)
            scratch = torch.empty(step, cols, dtype=torch.float32) if converts_in_place else None
            for r0 in range(0, n_rows, step):
                rows = slice(r0, min(r0 + step, n_rows))
                y[:, rows] = F.linear(x, rows_fp32(rows, scratch))
        return y if bias is None else y + bias[e].float()

    return project


def dequantize_experts(weights: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """All local experts as fp32 ``(E_L, 2I, H)`` and ``(E_L, H, I)`` (for twins and tests)."""
    n = weights.num_experts
    return (
        torch.stack([expert_gate_up(weights, e) for e in range(n)]),
        torch.stack([expert_down(weights, e) for e in range(n)]),
    )


def as_dense(weights: ExpertWeights) -> ExpertWeights:
    """The same experts as ``format='dense'`` fp32 weights (biases kept)."""
    gate_up, down = dequantize_experts(weights)
    return ExpertWeights("dense", gate_up, down, gate_up_bias=weights.gate_up_bias, down_bias=weights.down_bias)
