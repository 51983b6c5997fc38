"""Named override points of the built-in MoE experts, and how an override is composed into them.

An *override submission* ships one function for one named point of a built-in base; the
composition is an ordinary ``moe.fused_experts`` kernel (the base's ``prepare`` and an entry
with the slot's signature), verified and routed like any other candidate.

Base ``fused_experts`` — the built-in ``moe.fused_experts`` experts (gather → GEMM1 →
epilogue → GEMM2 → weighted finalize). The arena calls the same block
``nvfp4_moe_megakernel``. Its points, per expert, on fp32 tensors:

- ``gemm1_epilogue(gate, up) -> act``: ``gate``, ``up`` ``(N, I)`` (the GEMM1 outputs, gate
  rows then up rows of ``W13``); returns ``(N, I)``. Replaces the gated activation; by default
  the bound model's activation (``silu(g)·u``, or swigluoai for MiniMax-M3 / GPT-OSS).
- ``down_epilogue(y) -> y``: ``y (N, H)``, the expert's GEMM2 output before its routing
  weight; returns ``(N, H)``. Identity by default.

Dimensions:
    M tokens, N the tokens routed to one expert, H hidden, E experts, K top-k, I intermediate.

Arguments (:func:`compose`): ``base`` (name or alias), ``point``, ``fn`` (the override),
``act`` (the default activation). The composed entry takes the slot's ``x (M, H)``,
``topk_ids (M, K)`` (``-1`` contributes nothing), ``topk_weights (M, K)``, ``prepared``,
``out (M, H)``.

Returns: ``(entry, prepare)``; the entry writes ``out`` and returns None.

Pseudocode::

    for e in routed ids:  rows (m, k) with topk_ids[m, k] == e
        g | u   = x[m]·W13[e]ᵀ (+ b13)                   # dequantised per expert, fp32
        y       = down_epilogue((gemm1_epilogue(g, u))·W2[e]ᵀ (+ b2))
        acc[m] += topk_weights[m, k] · y
    out.copy_(acc)

The composition runs the torch path of the built-in experts (per-expert dequantisation of any
:data:`~kernelslot.kernels.experts_spec.EXPERT_FORMATS` weights, fp32 accumulation), never a
native fast path, so the override sees exactly the tensors described above. An override that
returns anything but a tensor of the shape it was given raises.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kernelslot.kernels import moe as builtin
from kernelslot.kernels.moe_block.expert_weights import expert_projection
from kernelslot.kernels.moe_block.projections import gated_activation
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights


@dataclass(frozen=True)
class OverrideBase:
    name: str
    slot: str
    points: dict[str, int]  # point -> how many positional arguments the override takes
    aliases: tuple[str, ...] = ()


BASES = {b.name: b for b in (
    OverrideBase("fused_experts", "moe.fused_experts", {"gemm1_epilogue": 2, "down_epilogue": 1},
                 aliases=("nvfp4_moe_megakernel", "builtin.fused_experts")),
)}


def find_base(name: str) -> OverrideBase | None:
    """The base called ``name`` (its own name or an alias), or None."""
    return next((b for b in BASES.values() if name == b.name or name in b.aliases), None)


def _checked(point: str, fn: Callable, like: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
    y = fn(*args)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(like.shape):
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"override {point} must return a tensor of shape {tuple(like.shape)}, got {got}")
    return y.float()


def compose(base: str, point: str, fn: Callable, act: ExpertActivation) -> tuple[Callable, Callable]:
    """``(entry, prepare)`` of ``base`` with ``fn`` at ``point`` and ``act`` as the default activation."""
    b = find_base(base)
    if b is None or point not in b.points:
        raise ValueError(f"no override point {point!r} on base {base!r}; known: "
                         + ", ".join(f"{n}.{p}" for n, x in BASES.items() for p in x.points))

    def gemm1(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return _checked(point, fn, g, g, u) if point == "gemm1_epilogue" else gated_activation(g, u, act)

    def down(y: torch.Tensor) -> torch.Tensor:
        return _checked(point, fn, y, y) if point == "down_epilogue" else y

    def entry(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, prepared: ExpertWeights,
              out: torch.Tensor) -> None:
        out.copy_(_experts(prepared, x.float(), topk_ids.long(), topk_weights, gemm1, down))

    return entry, builtin.prepare


def _experts(weights: ExpertWeights, x: torch.Tensor, ids: torch.Tensor, topk_weights: torch.Tensor,
             gemm1: Callable, down: Callable) -> torch.Tensor:
    """``Σ_k w[m,k]·down(W2[e]·gemm1(W13[e]·x[m]))`` over routed ids (``-1`` contributes nothing)."""
    if ids.shape != topk_weights.shape or ids.shape[0] != x.shape[0]:
        raise ValueError(f"fused_experts: topk_ids {tuple(ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
                         f"must both be (M={x.shape[0]}, K)")
    if bool((ids >= weights.num_experts).any()) or bool((ids < -1).any()):
        raise ValueError(f"fused_experts: expert ids must lie in [-1, {weights.num_experts})")
    acc = torch.zeros(x.shape[0], weights.hidden_size, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids[ids >= 0]).tolist():
        tokens, slots = torch.nonzero(ids == e, as_tuple=True)
        gu = expert_projection(weights, e, "gate_up")(x[tokens])
        inter = gu.shape[1] // 2
        y = down(expert_projection(weights, e, "down")(gemm1(gu[:, :inter], gu[:, inter:])))
        acc.index_add_(0, tokens, y * topk_weights[tokens, slots].float().unsqueeze(1))
    return acc
