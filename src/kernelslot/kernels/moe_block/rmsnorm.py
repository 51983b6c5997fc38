"""Stage 1: the block's one RMSNorm, optionally after a fused residual add, with its twin.

Contract: ``x`` and ``residual`` ``(T, H)`` in the I/O dtype; ``gamma`` ``(H,)``.
``s = x + residual`` is computed in fp32 and rounded to ``x.dtype`` (the value an engine
keeps as its residual stream, written to ``out_residual`` when given); the norm is taken of that
rounded sum, in fp32: ``h = s·rsqrt(mean(s²) + eps)·gamma``. ``h`` stays fp32 and is the one
normed hidden reused by the router and every expert. Gemma-style ``(1 + w)`` norms pass
``1 + w`` as ``gamma``.
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
