"""The expert MLP: gate/up projection, gated activation, down projection, with its twin.

One expert's computation, run by the leaves (:mod:`leaves`) and the shared expert for each
expert they touch: seed 003's MX ``gate_up`` / ``down`` projections made device-neutral (seed
003 is the MoE decode megakernel source document the project was created from,
``../shared/seeds/003_fbad06efb3d9daf3.txt``). The weights arrive as fp32 projections from
:mod:`expert_weights`, so this module is format-agnostic.

Dimensions:
    N rows (the tokens this expert runs on), H hidden, I intermediate.

Arguments (:func:`expert_mlp`):
    x             (N, H) fp32, already :func:`expert_input` (its MXFP8 round trip on the MX path).
    gate_up       projection ``x -> x·W13ᵀ + b13``, fp32 (N, 2I): gate columns then up columns.
    down          projection ``a -> a·W2ᵀ + b2``, fp32 (N, H).
    act           :class:`ExpertActivation`: kind, α, up bias β, gate/up clamps (either bound optional).
    mx_act_quant  quantise the intermediate ``a`` to MXFP8 before down (the MX path).

Returns:
    fp32 (N, H), the expert output before any affinity or routed scaling.

Pseudocode, per expert::

    g, u = split(x·W13ᵀ + b13)                      # W13 (2I, H): gate rows then up rows
    a    = act(clamp(g)) · (clamp(u) + β)           # each clamp bound optional; after the bias
    a    = mxfp8_roundtrip(a)  if mx_act_quant      # online quantisation of the intermediate
    y    = a·W2ᵀ + b2                                # W2 (H, I)

``act``: ``silu`` g·σ(g); ``swish`` and ``swigluoai`` g·σ(α·g); ``gelu`` (erf); ``gelu_tanh``.
With ``mx_act_quant`` (the MX path), ``h`` is quantised to MXFP8 E4M3 before gate/up and ``a``
is quantised to MXFP8 E4M3 before down (32-element blocks along the contraction dim, E8M0
floor scales, RNE elements; :mod:`kernelslot.formats`). Everything accumulates in fp32.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from kernelslot.formats.mx import dequantize_mx, quantize_mx
from kernelslot.kernels.experts_spec import ExpertActivation


def _clamp(x: torch.Tensor, bounds: tuple[Optional[float], Optional[float]]) -> torch.Tensor:
    lower, upper = bounds
    if lower is None and upper is None:
        return x
    return x.clamp(min=lower, max=upper)


def gated_activation(gate: torch.Tensor, up: torch.Tensor, act: ExpertActivation) -> torch.Tensor:
    """``act(clamp(gate)) · (clamp(up) + up_bias)`` in fp32."""
    g = _clamp(gate, act.gate_clamp)
    u = _clamp(up, act.up_clamp)
    if act.kind == "silu":
        a = F.silu(g)
    elif act.kind in ("swish", "swigluoai"):
        a = g * torch.sigmoid(act.alpha * g)
    elif act.kind == "gelu":
        a = F.gelu(g)
    elif act.kind == "gelu_tanh":
        a = F.gelu(g, approximate="tanh")
    else:
        raise ValueError(f"unknown expert activation {act.kind!r}")
    return a * (u + act.up_bias) if act.up_bias else a * u


def mxfp8_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """``x`` (…, n) fp32 quantised to MXFP8 E4M3 (blocks of 32 on the last dim) and back to fp32."""
    if x.shape[-1] % 32:
        raise ValueError(f"MXFP8 activation quantisation needs the contraction dim divisible by 32, got {x.shape[-1]}")
    data, scales = quantize_mx(x.float(), "fp8_e4m3")
    return dequantize_mx(data, scales, "fp8_e4m3", torch.float32)


def expert_input(h: torch.Tensor, mx_act_quant: bool) -> torch.Tensor:
    """The expert input: ``h`` itself, or on the MX path its MXFP8 round trip (per token row,
    so it is computed once per call and shared by every expert)."""
    return mxfp8_roundtrip(h) if mx_act_quant else h


Projection = Callable[[torch.Tensor], torch.Tensor]  # x (N, in) fp32 -> x·Wᵀ + b, fp32 (N, out)


def expert_mlp(
    x: torch.Tensor, gate_up: Projection, down: Projection, act: ExpertActivation, mx_act_quant: bool = False
) -> torch.Tensor:
    """One expert on ``x (N, H)`` fp32 (already :func:`expert_input`); ``gate_up`` yields gate
    columns then up columns. With ``mx_act_quant`` the intermediate is quantised to MXFP8 before
    down. Returns fp32 ``(N, H)``."""
    gu = gate_up(x)
    inter = gu.shape[1] // 2
    a = gated_activation(gu[:, :inter], gu[:, inter:], act)
    if mx_act_quant:
        a = mxfp8_roundtrip(a)
    return down(a)


def gated_activation_reference(gate: torch.Tensor, up: torch.Tensor, act: ExpertActivation) -> torch.Tensor:
    """Twin of :func:`gated_activation` written from the formulas (no ``F`` activations)."""
    lo, hi = act.gate_clamp
    g = gate if lo is None else torch.maximum(gate, torch.tensor(lo, dtype=gate.dtype))
    g = g if hi is None else torch.minimum(g, torch.tensor(hi, dtype=gate.dtype))
    lo, hi = act.up_clamp
    u = up if lo is None else torch.maximum(up, torch.tensor(lo, dtype=up.dtype))
    u = u if hi is None else torch.minimum(u, torch.tensor(hi, dtype=up.dtype))
    if act.kind == "silu":
        a = g / (1.0 + torch.exp(-g))
    elif act.kind in ("swish", "swigluoai"):
        a = g / (1.0 + torch.exp(-act.alpha * g))
    elif act.kind == "gelu":
        a = 0.5 * g * (1.0 + torch.erf(g / math.sqrt(2.0)))
    elif act.kind == "gelu_tanh":
        a = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))
    else:
        raise ValueError(f"unknown expert activation {act.kind!r}")
    return a * (u + act.up_bias)
