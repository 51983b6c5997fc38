"""The ``moe.block_tkg`` install point: a decoder layer's ``post_attention_layernorm`` + sparse
MoE block, where together they compute the slot's semantics, are served by one slot call.

The slot fuses the RMSNorm into the block (``h = rmsnorm(x)·gamma``; router on h; experts on h;
``out = routed_scaling_factor·Σ affinity·expert(h) + shared(h)``), so the install point replaces
the layer's ``post_attention_layernorm`` by a pass-through and its ``mlp`` by :class:`BlockSite`,
which calls ``entry(x (T, H), None, prepared, eps, out, None, None)`` (the layer adds the
residual itself). The layer view (:class:`~kernelslot.slots.moe_block.MoeBlockLayer`) is built from
the modules: gamma (``w`` or ``1 + w``, probed), the router's weight / bias / correction bias and
top-K, the experts (:func:`~kernelslot.engines.transformers.layout.expert_weights`, activation
probed), the shared expert if any, ``routed_scaling_factor``.

**Semantics are checked, not assumed.** The router's mode (softmax over all experts, sigmoid,
top-K then softmax over the K; renormalised or not) is found by probing: the first layer's own
``mlp(norm(x))`` runs in fp64 on random tokens and each mode's slot reference
(:func:`~kernelslot.slots.moe_block.moe_block_reference`) is compared with it. No mode matching
(DeepSeek-V3's grouped routing, a gated shared expert of another form, a post-expert norm, ...)
means the class is "not run" for this slot, with that reason.
"""
from __future__ import annotations

import copy
import itertools
from typing import Any, Optional

import torch

from kernelslot.abi import CallDescriptor
from kernelslot.slots.base import dtype_name

SLOT = "moe.block_tkg"
_ROUTER_MODES = (("softmax", True), ("sigmoid", True), ("softmax", False))
_PROBE_REL = 1e-4  # fp64 probe against the fp32-h reference: a matching mode agrees to ~1e-7


class _PassThrough(torch.nn.Module):
    """The layer's post-attention norm while the block serves it (the block normalises)."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.original = original

    @property
    def weight(self) -> torch.Tensor:
        return self.original.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _router(mlp: torch.nn.Module) -> Optional[torch.nn.Module]:
    for name in ("gate", "router"):
        r = getattr(mlp, name, None)
        if isinstance(r, torch.nn.Module) and isinstance(getattr(r, "weight", None), torch.Tensor) and hasattr(r, "top_k"):
            return r
    return None


def _shared(mlp: torch.nn.Module):
    """``(gate_up (1, 2I, H), down (1, H, I), activation)`` of the shared expert, None if there is
    none, or a string saying why it cannot be expressed."""
    from kernelslot.kernels.experts_spec import ExpertActivation

    s = next((getattr(mlp, n) for n in ("shared_experts", "shared_expert") if getattr(mlp, n, None) is not None), None)
    if s is None:
        return None
    if any(getattr(mlp, n, None) is not None for n in ("shared_expert_gate",)):
        return "a gated shared expert with a Linear gate"
    if isinstance(getattr(s, "gate_up_proj", None), torch.nn.Linear) and hasattr(s, "swiglu_limit"):
        gu, act = s.gate_up_proj.weight, ExpertActivation.swigluoai(float(s.swiglu_alpha), float(s.swiglu_limit))
    elif all(isinstance(getattr(s, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj")):
        from kernelslot.engines.transformers.activation import _is_silu

        if not _is_silu(s.act_fn):
            return f"a shared expert with activation {type(s.act_fn).__name__}"
        gu, act = torch.cat([s.gate_proj.weight, s.up_proj.weight]), ExpertActivation("silu")
    else:
        return f"a shared expert of form {type(s).__name__}"
    return gu.detach()[None], s.down_proj.weight.detach()[None], act


def build_layer(norm: torch.nn.Module, mlp: torch.nn.Module, router_mode: tuple[str, bool], norm_topk: bool):
    """The :class:`MoeBlockLayer` view of one layer in one router mode, or a string (why not)."""
    from kernelslot.engines.transformers.layout import describe_module, expert_weights, probe_activation
    from kernelslot.engines.transformers.norm import probe_rmsnorm
    from kernelslot.kernels.experts_spec import ExpertWeights
    from kernelslot.kernels.moe_block.config import MoeBlockConfig, SharedExpert
    from kernelslot.slots.moe_block import MoeBlockLayer

    kind = probe_rmsnorm(norm)
    if kind is None:
        return f"its post-attention norm {type(norm).__name__} is not an RMSNorm of the slot's form"
    router, experts = _router(mlp), getattr(mlp, "experts", None)
    if router is None or experts is None or not hasattr(experts, "gate_up_proj"):
        return f"{type(mlp).__name__} has no top-K router and experts module"
    if describe_module(experts)["post_expert_norm"]:
        return "its experts apply a post-expert norm"
    act = probe_activation(experts)
    if act is None:
        return "its experts' activation matches none the slot expresses"
    shared = _shared(mlp)
    if isinstance(shared, str):
        return f"it has {shared}, which the slot does not express"
    dtype = experts.gate_up_proj.dtype
    dense = expert_weights(experts)
    w = ExpertWeights("dense", dense.gate_up.to(dtype), dense.down.to(dtype),
                      gate_up_bias=None if dense.gate_up_bias is None else dense.gate_up_bias.to(dtype),
                      down_bias=None if dense.down_bias is None else dense.down_bias.to(dtype))
    gamma = norm.weight.detach()
    gamma = (1.0 + gamma.float()).to(dtype) if kind == "gemma" else gamma.to(dtype)
    e = int(w.num_experts)
    cfg = MoeBlockConfig(top_k=int(router.top_k), num_experts=e, num_local_experts=e,
                         router_activation=router_mode[0], router_pre_norm=router_mode[1], norm_topk_prob=norm_topk,
                         activation=act, routed_scaling_factor=float(getattr(mlp, "routed_scaling_factor", 1.0) or 1.0))
    bias = getattr(router, "bias", None)
    corr = getattr(router, "e_score_correction_bias", None)
    shared_expert = None
    if shared is not None:
        gu, dn, sact = shared
        shared_expert = SharedExpert(ExpertWeights("dense", gu.to(dtype), dn.to(dtype)), sact)
    return MoeBlockLayer(gamma, router.weight.detach().to(dtype), w, cfg,
                         None if bias is None else bias.detach().to(dtype),
                         None if corr is None else corr.detach().float(), shared_expert)


def _eps(norm: torch.nn.Module) -> float:
    from kernelslot.engines.transformers.norm import _eps as eps

    return eps(norm)


def probe_mode(norm: torch.nn.Module, mlp: torch.nn.Module):
    """``([(router mode, norm_topk_prob), ...], returns a tuple)``: every mode whose slot reference reproduces ``mlp(norm(x))`` in fp64,
    or a string saying why none does."""
    from kernelslot.slots.moe_block import moe_block_reference

    n64, m64 = copy.deepcopy(norm).double(), copy.deepcopy(mlp).double()
    for sub in m64.modules():  # the probe runs the model's own (eager) experts code on the copy
        sub.__dict__.pop("_kernelslot_experts", None)
        if getattr(sub, "config", None) is not None and hasattr(sub.config, "_experts_implementation"):
            sub.config._experts_implementation = "eager"
    h = norm.weight.shape[0]
    x = torch.randn(1, 16, h, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        got = m64(n64(x))
        tup = isinstance(got, tuple)
        got = (got[0] if tup else got).reshape(16, h)
    worst, found = None, []
    for mode, norm_topk in itertools.product(_ROUTER_MODES, (True, False)):
        layer = build_layer(n64, m64, mode, norm_topk)
        if isinstance(layer, str):
            return layer
        want = moe_block_reference(x[0], None, layer, _eps(norm))["out"].double()
        rel = float((want - got).norm() / got.norm().clamp(min=1e-30))
        if rel < _PROBE_REL:
            found.append((mode, norm_topk))
        worst = rel if worst is None else min(worst, rel)
    if found:  # several can be the same block (softmax over all then renormalised = softmax over the K)
        return found, tup
    return (f"its router and combine match no routing the slot expresses (softmax / sigmoid over all experts, "
            f"or top-K then softmax; renormalised or not): closest relative error {worst:.2g}")


def semantic_profile(layer, gemma: bool) -> Optional[str]:
    """The model profile (slots/models.py) whose block semantics the layer has, or None: router
    kind, renormalisation, routed scaling, expert activation, (1 + w) norm, shared expert and
    correction bias all as the profile states them. A candidate bound to a profile serves only
    layers with that profile's semantics (what the referee verified it on)."""
    from kernelslot.slots.models import MODELS

    cfg = layer.config
    router = {("softmax", True): "softmax", ("sigmoid", True): "sigmoid", ("softmax", False): "topk_softmax"}.get(
        (cfg.router_activation, cfg.router_pre_norm))
    for m in MODELS.values():
        if (m.router == router and m.norm_topk_prob == cfg.norm_topk_prob
                and m.routed_scaling_factor == cfg.routed_scaling_factor and m.activation == cfg.activation
                and m.gemma_norm == gemma and m.shared_expert == (layer.shared is not None)
                and m.correction_bias == (layer.correction_bias is not None)):
            return m.name
    return None


def choose_layer(norm: torch.nn.Module, mlp: torch.nn.Module, modes: list):
    """The layer view in the first matching mode that names a model profile (else the first mode)."""
    from kernelslot.engines.transformers.norm import probe_rmsnorm

    gemma = probe_rmsnorm(norm) == "gemma"
    views = [build_layer(norm, mlp, mode, norm_topk) for mode, norm_topk in modes]
    return next((v for v in views if semantic_profile(v, gemma) is not None), views[0])


class BlockSite(torch.nn.Module):
    """Stands in for one sparse MoE block (the norm before it is a :class:`_PassThrough`)."""

    def __init__(self, original: torch.nn.Module, norm: torch.nn.Module, layer, state, returns_tuple: bool):
        from kernelslot.engines.transformers.norm import probe_rmsnorm

        super().__init__()
        self.original, self.eps, self.layer = original, _eps(norm), layer
        self.profile = semantic_profile(layer, probe_rmsnorm(norm) == "gemma")
        self._state, self._tuple = state, returns_tuple
        self.routed = state.prepare("moe_block", layer)

    def forward(self, x: torch.Tensor):
        h = x.shape[-1]
        x2 = x.reshape(-1, h).contiguous()
        out = torch.empty_like(x2)
        cfg, w = self.layer.config, self.layer.experts
        desc = CallDescriptor(model=self.profile, phase=self._state.context.phase, dtype=dtype_name(x.dtype),
                              num_tokens=x2.shape[0],
                              top_k=cfg.top_k, hidden_size=h, intermediate_size=w.intermediate_size,
                              num_experts=cfg.num_experts, quant="dense", arch=x.device.type, last_dim=h, world_size=1)
        self._state.call(desc, x2, None, self.routed, self.eps, out, None, None)
        out = out.reshape(x.shape)
        return (out, None) if self._tuple else out


def find_sites(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, Any]] | str:
    """``(layer name, decoder layer, (matching modes, returns a tuple))`` of every block site, or why none."""
    layers = [(n, m) for n, m in model.named_modules()
              if isinstance(getattr(m, "post_attention_layernorm", None), torch.nn.Module)
              and _router(getattr(m, "mlp", None) or torch.nn.Module()) is not None]
    if not layers:
        return "no decoder layer has a post-attention norm followed by a sparse MoE block with a top-K router"
    mode = probe_mode(layers[0][1].post_attention_layernorm, layers[0][1].mlp)
    if isinstance(mode, str):
        return f"{type(layers[0][1].mlp).__name__}: {mode}"
    return [(n, m, mode) for n, m in layers]

