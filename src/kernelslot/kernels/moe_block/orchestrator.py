"""Stage 0: the MoE decode block orchestrator (seed 003 ``moe_block_tkg``), one pass per call.

Seed 003 is the MoE decode megakernel source document the project was created from
(``../shared/seeds/003_fbad06efb3d9daf3.txt``, a walkthrough of nkilib's ``moe_block_tkg``).
The orchestrator is the block's entry (the ``moe.block_tkg`` slot's incumbent): it runs every
other stage once, decides the strategy here and only here (:func:`choose_strategy`), and
applies ``routed_scaling_factor`` in exactly one place.

Dimensions:
    T tokens, H hidden, E global experts, E_L local experts, K top-k, I intermediate.

Arguments (:func:`moe_block_tkg`):
    x         (T, H) I/O dtype, the layer input.    residual: (T, H) or None.
    params    :class:`MoeBlockParams` from :func:`prepare_moe_block`: gamma (H,),
              router_weight (E, H), experts (E_L local), config, router_bias (E,),
              correction_bias (E,) for selection only, shared (optional); shapes checked once.
    eps       the RMSNorm epsilon.

Writes:
    ``out`` (T, H); ``out_residual`` (T, H) or None: ``x + residual`` in the I/O dtype;
    ``router_logits`` (T, E) or None: the fp32 logits. All with ``copy_``, so any strides and
    the output dtype are honoured; returns None. Inputs are never modified; nothing is cached
    between calls.

Pseudocode::

    if native_block(params, ...): return            # whole block in one native call, where covered
    h = rmsnorm(x [+ residual]) once, fp32           # :mod:`rmsnorm`; -> out_residual
    r = route(h)                                     # :mod:`router`;  -> router_logits
    local_index = r.expert_index - rank_id·E_L, -1 off this rank
    if choose_strategy(cfg, T) == "all_expert":      # auto: all-expert when T·K >= E_L
        coef = mask_affinities(r.affinities, apply_index_mask = keystone ∧ POST_SCALE)
        acc  = all_expert_experts(h, local_index, coef)
    else:
        acc  = selective_experts(h, local_index, r.topk_affinities)
    acc = routed_scaling_factor · acc                # the one place it is applied
    out = acc [+ shared_expert(h)]

The keystone is the seed's name for ``router_pre_norm ∧ ¬norm_topk_prob``
(:attr:`MoeBlockConfig.needs_index_mask`): the one condition under which the router leaves
dense affinities, so the all-expert path must re-apply the top-K index mask.

:func:`block_forward` is the pseudocode after ``native_block`` with the expert leaves as parameters
(the Triton variant, ``kernels/triton/moe_block.py``, passes its own); it returns ``out`` as fp32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from kernelslot.kernels.experts_spec import ScalingMode
from kernelslot.kernels.moe_block.config import MoeBlockConfig, SharedExpert
from kernelslot.kernels.moe_block.experts_dispatch import attach_fast_paths, attach_native_block, native_block
from kernelslot.kernels.moe_block.leaves import all_expert_experts, selective_experts
from kernelslot.kernels.moe_block.masking import local_expert_index, mask_affinities
from kernelslot.kernels.moe_block.rmsnorm import residual_rmsnorm
from kernelslot.kernels.moe_block.router import route
from kernelslot.kernels.moe_block.shared_expert import MX_FORMATS, shared_expert_forward
from kernelslot.kernels.experts_spec import ExpertWeights


@dataclass(frozen=True)
class MoeBlockParams:
    """One MoE layer as the block consumes it; shapes are checked once, here."""

    gamma: torch.Tensor  # (H,), Gemma-style norms pass 1 + w
    router_weight: torch.Tensor  # (E, H)
    experts: ExpertWeights  # E_L local experts
    config: MoeBlockConfig
    router_bias: Optional[torch.Tensor] = None  # (E,)
    correction_bias: Optional[torch.Tensor] = None  # (E,), selection only
    shared: Optional[SharedExpert] = None

    def __post_init__(self) -> None:
        cfg, hidden = self.config, self.experts.hidden_size
        if tuple(self.gamma.shape) != (hidden,):
            raise ValueError(f"moe_block: gamma must be (H={hidden},), got {tuple(self.gamma.shape)}")
        if tuple(self.router_weight.shape) != (cfg.num_experts, hidden):
            raise ValueError(
                f"moe_block: router weight must be (E={cfg.num_experts}, H={hidden}), got {tuple(self.router_weight.shape)}"
            )
        for name in ("router_bias", "correction_bias"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != (cfg.num_experts,):
                raise ValueError(f"moe_block: {name} must be (E={cfg.num_experts},), got {tuple(t.shape)}")
        if self.experts.num_experts != cfg.num_local_experts:
            raise ValueError(
                f"moe_block: experts hold {self.experts.num_experts} local experts, config says E_L={cfg.num_local_experts}"
            )
        if self.shared is not None and self.shared.weights.hidden_size != hidden:
            raise ValueError(f"moe_block: shared expert hidden size {self.shared.weights.hidden_size} != H={hidden}")


_FIELDS = ("gamma", "router_weight", "experts", "config", "router_bias", "correction_bias", "shared")


def prepare_moe_block(kind: str, layer: Any) -> MoeBlockParams:
    """``prepare("moe_block", layer)``: build :class:`MoeBlockParams` from any object carrying
    its field names (the slot's validator-owned view). Tensors are referenced, never modified."""
    if kind != "moe_block":
        raise ValueError(f"prepare_moe_block: unknown layer kind {kind!r}; expected 'moe_block'")
    missing = [f for f in _FIELDS if not hasattr(layer, f)]
    if missing:
        raise TypeError(f"prepare_moe_block: layer view lacks {missing}; expected fields {_FIELDS}")
    params = MoeBlockParams(**{f: getattr(layer, f) for f in _FIELDS})
    attach_fast_paths(params.experts)  # native CPU layout, built once here
    if params.shared is not None:
        attach_fast_paths(params.shared.weights)
    attach_native_block(params)  # the whole block in one native call, where covered
    return params


def choose_strategy(config: MoeBlockConfig, num_tokens: int) -> str:
    """The one strategy decision. ``auto``: all-expert once the routed (token, expert) pairs
    reach the local expert count (most experts are touched anyway), selective below."""
    if config.strategy != "auto":
        return config.strategy
    return "all_expert" if num_tokens * config.top_k >= config.num_local_experts else "selective"


def moe_block_tkg(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    params: MoeBlockParams,
    eps: float,
    out: torch.Tensor,
    out_residual: Optional[torch.Tensor] = None,
    router_logits: Optional[torch.Tensor] = None,
) -> None:
    """The fused decode block; writes ``out`` (and the optional outputs) in place."""
    check_hidden(x, params)
    if native_block(params, x, residual, eps, out, out_residual, router_logits):
        return
    out.copy_(block_forward(x, residual, params, eps, out_residual, router_logits))


def check_hidden(x: torch.Tensor, params: MoeBlockParams) -> None:
    """Raise ValueError unless ``x`` is ``(T, H)`` with the experts' hidden size."""
    if x.dim() != 2 or x.shape[1] != params.experts.hidden_size:
        raise ValueError(f"moe_block: x must be (T, H={params.experts.hidden_size}), got {tuple(x.shape)}")


Leaf = Callable[..., torch.Tensor]  # the leaves.py boundary: (weights, h, local_index, affinities, act, scaling, mx) -> fp32 (T, H)


def block_forward(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    params: MoeBlockParams,
    eps: float,
    out_residual: Optional[torch.Tensor] = None,
    router_logits: Optional[torch.Tensor] = None,
    selective: Leaf = selective_experts,
    all_expert: Leaf = all_expert_experts,
) -> torch.Tensor:
    """The module pseudocode after ``native_block``, with ``selective`` / ``all_expert`` as the expert
    leaves (the shared expert runs on ``selective``); fills ``out_residual`` and ``router_logits``, returns ``out`` as fp32 ``(T, H)``."""
    cfg = params.config
    h = residual_rmsnorm(x, residual, params.gamma, eps, out_residual)
    routed = route(
        h, params.router_weight, cfg.top_k, cfg.router_activation, cfg.router_pre_norm, cfg.norm_topk_prob,
        params.router_bias, params.correction_bias,
    )
    if router_logits is not None:
        router_logits.copy_(routed.logits)
    local_index = local_expert_index(routed.expert_index, cfg.rank_id, cfg.num_local_experts)
    mx_act_quant = params.experts.format in MX_FORMATS
    if choose_strategy(cfg, x.shape[0]) == "all_expert":
        masked = mask_affinities(
            routed.affinities, routed.expert_index, cfg.rank_id, cfg.num_local_experts,
            apply_index_mask=cfg.needs_index_mask and cfg.scaling is ScalingMode.POST_SCALE,
        )
        acc = all_expert(params.experts, h, local_index, masked, cfg.activation, cfg.scaling, mx_act_quant)
    else:
        acc = selective(params.experts, h, local_index, routed.topk_affinities, cfg.activation, cfg.scaling, mx_act_quant)
    if cfg.routed_scaling_factor != 1.0:
        acc = acc * cfg.routed_scaling_factor
    if params.shared is not None:
        acc = acc + shared_expert_forward(params.shared, h, selective)
    return acc
