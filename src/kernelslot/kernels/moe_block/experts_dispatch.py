"""The one place that picks the implementation of the expert leaves (and of the whole block).

Callers never choose a fast path: the torch stages (:mod:`leaves`, :mod:`orchestrator`) ask
here first and run their own torch code when the answer is None / False.
:func:`attach_fast_paths` runs at prepare time (``prepare_moe_block``,
``prepare_fused_experts``, the ``moe.fused_experts`` NVFP4 prepare); :func:`attach_native_block`
at ``prepare_moe_block`` time, after it.

Dimensions:
    T tokens, H hidden, E_L local experts, K top-k.

Arguments:
    weights          :class:`ExpertWeights`; params: :class:`MoeBlockParams`.
    h                (T, H) fp32; local_index: (T, K) local ids or -1.
    topk_affinities  (T, K) (selective); coef: (T, E_L), the all-expert coefficient sheet.
    act, scaling, mx_act_quant: as for the leaves.

Returns:
    :func:`native_selective` / :func:`native_all_expert`: the leaf's fp32 (T, H) accumulator,
    or None (the caller runs its torch leaf). :func:`native_block`: True when it ran (one native call
    for norm, router, top-K, routed and shared experts; CPU, fp32/bf16 I/O, ``1 <= T <= 64``)
    and wrote ``out`` and the optional outputs, else False (the torch block runs).

Pseudocode::

    prepare:    if CPU weights in native_supports:  layout[weights] = repack to native tiles
                if experts (and shared) have a layout:  block[params] = prepare_native_block(...)
    selective:  layout and CPU and native_supports(layout, act, T)
                    -> expert_mlp_native(h, local_index, topk_affinities, post_scale = POST_SCALE)
    all-expert: ids[t, e] = e where coef[t, e] != 0 else -1
                    -> expert_mlp_native(h, ids, coef, post_scale = True)

A layout is remembered for its :class:`ExpertWeights` object (dropped when the object is
garbage-collected), rebuilt on every prepare (weights reloaded in place must be seen) and never
repacked per call. Numerics: fp32 accumulation, the same MXFP8 activation quantisation; results
equal the torch leaves up to fp32 rounding order. ``KERNELSLOT_NATIVE=0`` turns the native path
off (the library then never loads).
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

from kernelslot.kernels import native
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights, ScalingMode
from kernelslot.kernels.native import block as native_blocks

_ATTACHED: dict[int, Any] = {}  # id(ExpertWeights) -> NativeExperts
_BLOCKS: dict[int, Any] = {}  # id(MoeBlockParams) -> NativeBlock


def attach_fast_paths(weights: ExpertWeights) -> None:
    """Prepare-time: build and attach the native layout when the native path covers ``weights``.
    Built on every prepare, never reused: a prepare after the weights were reloaded in place (the
    same object and storages, new values) must see the new values."""
    if weights.gate_up.device.type != "cpu":
        return
    if not native.native_supports(weights, ExpertActivation(), 1):
        return
    if id(weights) not in _ATTACHED:
        weakref.finalize(weights, _ATTACHED.pop, id(weights), None)
    _ATTACHED[id(weights)] = native.prepare_native_experts(weights)


def attach_native_block(params: Any) -> None:
    """Prepare-time (after :func:`attach_fast_paths` on its experts): remember the whole-block
    native view of ``params`` (:class:`MoeBlockParams`) when every part of it is covered."""
    experts = _ATTACHED.get(id(params.experts))
    if experts is None:
        return
    shared = _ATTACHED.get(id(params.shared.weights)) if params.shared is not None else None
    block = native_blocks.prepare_native_block(params, experts, shared)
    if block is not None:
        if id(params) not in _BLOCKS:
            weakref.finalize(params, _BLOCKS.pop, id(params), None)
        _BLOCKS[id(params)] = block


def native_block(params: Any, x: torch.Tensor, residual: Optional[torch.Tensor], eps: float, out: torch.Tensor,
                 out_residual: Optional[torch.Tensor], router_logits: Optional[torch.Tensor]) -> bool:
    """The whole block in one native call when its view is attached and the call is covered
    (CPU, fp32/bf16 I/O, ``1 <= T <= 64``); returns whether it ran (outputs then written)."""
    block = _BLOCKS.get(id(params))
    if block is None:
        return False
    return native_blocks.moe_block_native(block, x, residual, eps, out, out_residual, router_logits)


def _covered(weights: ExpertWeights, h: torch.Tensor, act: ExpertActivation):
    prepared = _ATTACHED.get(id(weights))
    if prepared is None or h.device.type != "cpu":
        return None
    return prepared if native.native_supports(prepared, act, h.shape[0]) else None


def _run(prepared, h, ids, coef, act, post_scale: bool, mx_act_quant: bool) -> torch.Tensor:
    out = torch.zeros(h.shape, dtype=torch.float32)
    native.expert_mlp_native(h.float().contiguous(), ids, coef.float(), prepared, act, post_scale,
                             mx_act_quant, out)
    return out


def native_selective(weights: ExpertWeights, h: torch.Tensor, local_index: torch.Tensor,
                     topk_affinities: torch.Tensor, act: ExpertActivation, scaling: ScalingMode,
                     mx_act_quant: bool) -> Optional[torch.Tensor]:
    """The selective leaf on the native path, or None (use the torch leaf)."""
    prepared = _covered(weights, h, act)
    if prepared is None:
        return None
    return _run(prepared, h, local_index, topk_affinities, act, scaling is ScalingMode.POST_SCALE, mx_act_quant)


def native_all_expert(weights: ExpertWeights, h: torch.Tensor, coef: torch.Tensor, act: ExpertActivation,
                      mx_act_quant: bool) -> Optional[torch.Tensor]:
    """The all-expert leaf on the native path, or None: ``coef`` is its ``(T, E_L)`` coefficient
    sheet; every (token, expert) with a non-zero coefficient runs, scaled by it."""
    prepared = _covered(weights, h, act)
    if prepared is None:
        return None
    experts = torch.arange(coef.shape[1]).expand_as(coef)
    ids = torch.where(coef != 0, experts, torch.full_like(experts, -1))
    return _run(prepared, h, ids, coef, act, True, mx_act_quant)
