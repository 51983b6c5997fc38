"""The whole MoE decode block (``moe.block_tkg``) as one native call for ``1 <= T <= 64``.

:func:`prepare_native_block` (at ``prepare_moe_block`` time) builds the block's native view when
every part is covered: CPU tensors, routed experts (and the shared expert, if any) with a
native layout attached, a supported activation. :func:`moe_block_native` then runs residual
add, RMSNorm, router GEMV, top-K, the routed experts and the shared expert in C (ks_block.c)
and returns True, or returns False without touching anything (the torch block runs). Numerics
follow the torch block stage by stage in fp32; the router's top-K breaks ties toward the lower
expert index; both strategies reduce to the routed set, so one grouped expert pass serves both.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from . import build
from .layout import MAX_TOKENS, NativeExperts, native_supports
from .ops import act_struct, default_threads
from ..experts_spec import ScalingMode


class KsBlock(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int32), ("num_experts", ctypes.c_int32), ("num_local", ctypes.c_int32),
                ("rank_id", ctypes.c_int32), ("top_k", ctypes.c_int32), ("softmax", ctypes.c_int32),
                ("pre_norm", ctypes.c_int32), ("norm_topk", ctypes.c_int32), ("post_scale", ctypes.c_int32),
                ("quant_act", ctypes.c_int32), ("shared_quant_act", ctypes.c_int32),
                ("routed_scaling", ctypes.c_float),
                ("gamma", ctypes.c_void_p), ("router_w", ctypes.c_void_p), ("router_bias", ctypes.c_void_p),
                ("correction_bias", ctypes.c_void_p), ("experts", ctypes.c_void_p), ("act", ctypes.c_void_p),
                ("shared", ctypes.c_void_p), ("shared_act", ctypes.c_void_p), ("shared_gate", ctypes.c_void_p)]


@dataclass(frozen=True, eq=False)
class NativeBlock:
    """The block's native view; owns the fp32 copies and ctypes structs it points to."""

    hidden: int
    num_experts: int
    struct: KsBlock = field(repr=False)
    keep: tuple = field(repr=False)


_MX = ("mxfp4", "mxfp8")


def _f32(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().to(device="cpu", dtype=torch.float32).contiguous()


def _ptr(t: Any) -> Optional[int]:
    if t is None:
        return None
    return t.data_ptr() if isinstance(t, torch.Tensor) else ctypes.addressof(t)


def prepare_native_block(params: Any, experts: Optional[NativeExperts],
                         shared: Optional[NativeExperts]) -> Optional[NativeBlock]:
    """The native view of :class:`MoeBlockParams` ``params``, or None when a part is not covered
    (``experts`` / ``shared`` are the attached native layouts, None when absent)."""
    cfg = params.config
    if build.loaded().lib is None or experts is None or params.gamma.device.type != "cpu":
        return None
    if not native_supports(experts, cfg.activation, 1) or params.router_weight.device.type != "cpu":
        return None
    if params.shared is not None and (shared is None or not native_supports(shared, params.shared.activation, 1)):
        return None
    gamma, router = _f32(params.gamma), _f32(params.router_weight)
    rbias, cbias = _f32(params.router_bias), _f32(params.correction_bias)
    act = act_struct(cfg.activation)
    sh_act = act_struct(params.shared.activation) if params.shared is not None else None
    gate = _f32(params.shared.gate) if params.shared is not None else None
    st = KsBlock(experts.hidden_size, cfg.num_experts, cfg.num_local_experts, cfg.rank_id, cfg.top_k,
                 cfg.router_activation == "softmax", cfg.router_pre_norm, cfg.norm_topk_prob,
                 cfg.scaling is ScalingMode.POST_SCALE, params.experts.format in _MX,
                 params.shared is not None and params.shared.weights.format in _MX,
                 cfg.routed_scaling_factor, _ptr(gamma), _ptr(router), _ptr(rbias), _ptr(cbias),
                 ctypes.addressof(experts.struct), ctypes.addressof(act),
                 None if shared is None else ctypes.addressof(shared.struct), _ptr(sh_act), _ptr(gate))
    return NativeBlock(experts.hidden_size, cfg.num_experts, st,
                       (gamma, router, rbias, cbias, act, sh_act, gate, experts, shared))


def moe_block_native(block: NativeBlock, x: torch.Tensor, residual: Optional[torch.Tensor], eps: float,
                     out: torch.Tensor, out_residual: Optional[torch.Tensor],
                     router_logits: Optional[torch.Tensor]) -> bool:
    """Run the block natively and fill the outputs (any strides / dtypes, via ``copy_``); False
    (nothing written) when the call is outside the native domain."""
    T = x.shape[0] if x.dim() == 2 else 0
    if not 1 <= T <= MAX_TOKENS or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    if residual is not None and (residual.dtype != x.dtype or residual.shape != x.shape or residual.device.type != "cpu"):
        return False
    if out_residual is not None and residual is None:
        return False  # the torch block raises the precise error
    H = block.hidden
    xc = x.contiguous()
    rc_res = residual.contiguous() if residual is not None else None
    y = torch.empty(T, H, dtype=torch.float32)
    res_out = torch.empty(T, H, dtype=x.dtype) if residual is not None else None
    logits = torch.empty(T, block.num_experts, dtype=torch.float32) if router_logits is not None else None
    st = build.loaded()
    rc = st.lib.ks_moe_block(ctypes.addressof(block.struct), xc.data_ptr(), _ptr(rc_res), T, x.dtype == torch.bfloat16,
                             float(eps), y.data_ptr(), _ptr(res_out), _ptr(logits), default_threads(),
                             build.ISA_NAMES.index(st.isa))
    if rc != 0:
        raise RuntimeError(f"moe_block native call failed (code {rc})")
    if out_residual is not None:
        out_residual.copy_(res_out)
    if router_logits is not None:
        router_logits.copy_(logits)
    out.copy_(y)
    return True


__all__ = ["NativeBlock", "moe_block_native", "prepare_native_block"]
