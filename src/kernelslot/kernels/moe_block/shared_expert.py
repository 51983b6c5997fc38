"""The shared expert: one dense-or-quantised expert applied to every token (dead in seed 003).

Seed 003 (the MoE decode megakernel source document the project was created from,
``../shared/seeds/003_fbad06efb3d9daf3.txt``) carries shared-expert parameters, but its Stage 3
is ``if has_shared_expert: pass`` and asserted out; here it is wired. It runs on the block's one
normed hidden ``h``; the orchestrator adds its output after ``routed_scaling_factor`` has been
applied to the routed sum.

Dimensions:
    T tokens, H hidden, I the shared expert's intermediate.

Arguments:
    shared  :class:`SharedExpert`: ``weights`` (:class:`ExpertWeights` holding exactly one
            expert, any format), ``activation``, optional ``gate`` (H,).
    h       (T, H) fp32, the normed hidden.

Returns:
    fp32 (T, H) ``= [σ(h·gate)] · expert(h)``, the gate factor only when the shared expert has one.

Pseudocode::

    mx = weights.format in (mxfp4, mxfp8)
    y  = selective_experts(weights, h, local_index = 0 for every token, coef = 1,
                           POST_SCALE, mx_act_quant = mx)         # expert(h), fp32
    if gate is not None:  y = y · σ(h·gate)                      # one factor per token

Running on the selective leaf lets the leaf's dispatcher serve it natively when its layout is
attached. MX-format shared weights get the same MXFP8 activation quantisation as the routed MX
path; other formats keep fp32 activations. The twin writes the same formula with explicit
matmuls and the formula-level activation.
"""
from __future__ import annotations

from typing import Callable

import torch

from kernelslot.kernels.experts_spec import ScalingMode
from kernelslot.kernels.moe_block.config import SharedExpert
from kernelslot.kernels.moe_block.expert_weights import expert_down, expert_gate_up
from kernelslot.kernels.moe_block.leaves import selective_experts
from kernelslot.kernels.moe_block.projections import gated_activation_reference, mxfp8_roundtrip

MX_FORMATS = ("mxfp4", "mxfp8")


def shared_expert_forward(shared: SharedExpert, h: torch.Tensor, selective: Callable[..., torch.Tensor] = selective_experts
                          ) -> torch.Tensor:
    """Every token through the one shared expert, on the ``selective`` leaf (by default the torch
    leaf, so its dispatcher can serve it natively when its layout is attached)."""
    w = shared.weights
    tokens = h.shape[0]
    only = torch.zeros(tokens, 1, dtype=torch.long, device=h.device)
    y = selective(w, h, only, torch.ones(tokens, 1, device=h.device), shared.activation, ScalingMode.POST_SCALE,
                  w.format in MX_FORMATS)
    if shared.gate is not None:
        y = y * torch.sigmoid(h.float() @ shared.gate.float()).unsqueeze(1)
    return y


def shared_expert_reference(shared: SharedExpert, h: torch.Tensor) -> torch.Tensor:
    """Torch twin: the same formula with explicit matmuls and the formula-level activation."""
    w = shared.weights
    mx = w.format in MX_FORMATS
    gate_up, down = expert_gate_up(w, 0), expert_down(w, 0)
    x = mxfp8_roundtrip(h.float()) if mx else h.float()
    gu = x @ gate_up.t() + (0.0 if w.gate_up_bias is None else w.gate_up_bias[0].float())
    inter = gate_up.shape[0] // 2
    a = gated_activation_reference(gu[:, :inter], gu[:, inter:], shared.activation)
    if mx:
        a = mxfp8_roundtrip(a)
    y = a @ down.t() + (0.0 if w.down_bias is None else w.down_bias[0].float())
    if shared.gate is not None:
        y = y / (1.0 + torch.exp(-(h.float() @ shared.gate.float()))).unsqueeze(1)
    return y
