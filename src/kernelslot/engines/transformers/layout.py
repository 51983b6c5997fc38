"""What a transformers experts module computes, in kernelslot's terms.

transformers' ``@use_experts_implementation`` modules store experts as 3-D parameters with
flags saying how: ``is_transposed`` (``gate_up_proj (E, H, 2I)``, ``down_proj (E, I, H)``;
GPT-OSS) or not (``(E, 2I, H)`` / ``(E, H, I)``), ``is_concatenated`` (gate block then up
block) or interleaved (``g0, u0, g1, u1, ...``; GPT-OSS), ``has_bias`` (``gate_up_proj_bias
(E, 2I)`` in the same order, ``down_proj_bias (E, H)``). :func:`expert_weights` turns any of
them into :class:`ExpertWeights` (gate rows then up rows, ``(E, 2I, H)``; biases de-interleaved
alike); tensors already in that layout are referenced, never copied.

:func:`probe_activation` identifies the gated activation by running the module's own
``_apply_gate`` on probe values laid out as the module stores them, and returns the
:class:`ExpertActivation` that reproduces it (or None: the module's own code must serve it).
"""
from __future__ import annotations

from typing import Optional

import torch

from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights

_PROBE_ATOL = 1e-5  # fp64 probe; a matching formula agrees to rounding, a different one by >1e-2


def describe_module(module: torch.nn.Module) -> dict:
    """The layout flags of an experts module (defaults: transformers' decorator defaults)."""
    return {
        "has_gate": bool(getattr(module, "has_gate", True)),
        "has_bias": bool(getattr(module, "has_bias", False)),
        "is_transposed": bool(getattr(module, "is_transposed", False)),
        "is_concatenated": bool(getattr(module, "is_concatenated", True)),
        "post_expert_norm": bool(getattr(module, "has_post_expert_norm", False)),
    }


def _gate_up_rows(t: torch.Tensor, concatenated: bool) -> torch.Tensor:
    """``(E, 2I, ...)`` rows in the module's order -> gate rows then up rows."""
    if concatenated:
        return t
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)


def expert_weights(module: torch.nn.Module) -> ExpertWeights:
    """The module's experts as dense :class:`ExpertWeights` in kernelslot's layout."""
    flags = describe_module(module)
    gate_up, down = module.gate_up_proj.detach(), module.down_proj.detach()
    if flags["is_transposed"]:
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    gate_up = _gate_up_rows(gate_up, flags["is_concatenated"])
    gate_up_bias = down_bias = None
    if flags["has_bias"]:
        gate_up_bias = _gate_up_rows(module.gate_up_proj_bias.detach(), flags["is_concatenated"]).float().contiguous()
        down_bias = module.down_proj_bias.detach().float().contiguous()
    return ExpertWeights("dense", gate_up.contiguous(), down.contiguous(), gate_up_bias=gate_up_bias, down_bias=down_bias)


def _interleave(gate: torch.Tensor, up: torch.Tensor, concatenated: bool) -> torch.Tensor:
    if concatenated:
        return torch.cat([gate, up], dim=-1)
    return torch.stack([gate, up], dim=-1).reshape(gate.shape[0], -1)


def _known_activations(module: torch.nn.Module) -> list[ExpertActivation]:
    """Candidate formulas: the plain gated ones and swigluoai with the module's own constants."""
    out = [ExpertActivation("silu"), ExpertActivation("gelu"), ExpertActivation("gelu_tanh")]
    alphas = {float(getattr(module, n)) for n in ("alpha", "swiglu_alpha") if isinstance(getattr(module, n, None), (int, float))}
    limits = {float(getattr(module, n)) for n in ("limit", "swiglu_limit") if isinstance(getattr(module, n, None), (int, float))}
    for a in alphas or {1.702}:
        for lim in limits or {7.0}:
            out.append(ExpertActivation.swigluoai(a, lim))
            out.append(ExpertActivation("swish", a))
    return out


def _formula64(g: torch.Tensor, u: torch.Tensor, act: ExpertActivation) -> torch.Tensor:
    (glo, ghi), (ulo, uhi) = act.gate_clamp, act.up_clamp
    g = g.clamp(min=glo, max=ghi) if (glo, ghi) != (None, None) else g
    u = u.clamp(min=ulo, max=uhi) if (ulo, uhi) != (None, None) else u
    if act.kind == "silu":
        a = torch.nn.functional.silu(g)
    elif act.kind in ("swish", "swigluoai"):
        a = g * torch.sigmoid(act.alpha * g)
    elif act.kind == "gelu":
        a = torch.nn.functional.gelu(g)
    else:
        a = torch.nn.functional.gelu(g, approximate="tanh")
    return a * (u + act.up_bias)


def probe_activation(module: torch.nn.Module, width: int = 64) -> Optional[ExpertActivation]:
    """The activation the module applies between gate/up and down, identified by probing.

    Probe values cover [-12, 12] for gate and up (past every clamp the known models use) in
    fp64; the module's ``_apply_gate`` (or ``act_fn(gate)·up``) runs on them in its storage
    order and each known formula is compared. None when nothing matches (or there is no gate).
    """
    flags = describe_module(module)
    if not flags["has_gate"] or flags["post_expert_norm"]:
        return None
    gen = torch.Generator().manual_seed(0)
    gate = (torch.rand(256, width, generator=gen, dtype=torch.float64) - 0.5) * 24
    up = (torch.rand(256, width, generator=gen, dtype=torch.float64) - 0.5) * 24
    gate[0], up[0] = torch.linspace(-12, 12, width, dtype=torch.float64), 0.0
    packed = _interleave(gate, up, flags["is_concatenated"])
    apply_gate = getattr(module, "_apply_gate", None)
    try:
        with torch.no_grad():
            got = apply_gate(packed) if apply_gate is not None else module.act_fn(gate) * up
    except Exception:  # the module's gate cannot run on a plain probe: leave it to its own code
        return None
    if tuple(got.shape) != tuple(gate.shape):
        return None
    for act in _known_activations(module):
        want = _formula64(gate, up, act)
        if torch.allclose(got.double(), want, rtol=_PROBE_ATOL, atol=_PROBE_ATOL):
            return act
    return None
