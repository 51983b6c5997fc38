"""Stage 1: the block's one RMSNorm, optionally after a fused residual add, with its torch twin.

The first stage of the block (seed 003's Stage 1; seed 003 is the MoE decode megakernel source
document the project was created from, ``../shared/seeds/003_fbad06efb3d9daf3.txt``). It
computes the normed hidden ``h`` once; the router and every expert (routed and shared) reuse
it, as the seed keeps its ``rmsnorm_out`` resident. The fused residual add is honoured on every
path (the seed: MX all-expert only).

Dimensions:
    T tokens, H hidden; every tensor is row-major, one token per row.

Arguments:
    x             (T, H) I/O dtype: the layer input.
    residual      (T, H) I/O dtype, or None: the residual stream, added before the norm.
    gamma         (H,): the norm weight; Gemma-style ``(1 + w)`` norms pass ``1 + w``.
    eps           float, added to the mean square.
    out_residual  (T, H), any strides, or None (given only with ``residual``): receives
                  ``x + residual`` rounded to ``x.dtype``, the value an engine keeps as its
                  residual stream.

Returns:
    ``h`` fp32 (T, H); writes ``out_residual`` when given. The twin returns
    ``(h fp32, x + residual in x.dtype or None)`` with the norm computed in fp64.

Pseudocode::

    s = x.float()                                        if residual is None
    s = (x.float() + residual.float()).to(x.dtype)       otherwise  -> out_residual
    h = s.float() · rsqrt(mean(s², over H) + eps) · gamma.float()     # fp32, of the rounded sum
"""
from __future__ import annotations

from typing import Optional

import torch


def residual_rmsnorm(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    gamma: torch.Tensor,
    eps: float,
    out_residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Return fp32 ``h``; fill ``out_residual`` (any strides) with ``x + residual`` when given."""
    if residual is None:
        if out_residual is not None:
            raise ValueError("residual_rmsnorm: out_residual was given but residual is None; pass both or neither")
        s = x.float()
    else:
        s = (x.float() + residual.float()).to(x.dtype)
        if out_residual is not None:
            out_residual.copy_(s)
        s = s.float()
    inv_rms = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)
    return s * inv_rms * gamma.float()


def residual_rmsnorm_reference(
    x: torch.Tensor, residual: Optional[torch.Tensor], gamma: torch.Tensor, eps: float
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Torch twin: ``(h fp32, x + residual in x.dtype or None)``, norm computed in fp64."""
    s = x if residual is None else (x.double() + residual.double()).to(x.dtype)
    sd = s.double()
    h = sd / torch.sqrt((sd * sd).sum(-1, keepdim=True) / sd.shape[-1] + eps) * gamma.double()
    return h.float(), (None if residual is None else s)
