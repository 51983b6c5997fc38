"""Slot ``moe.block_tkg``: the fused MoE decode block (seed 003), verified end to end.

Seed 003 is the MoE decode megakernel source document the project was created from (a
walkthrough of nkilib's ``moe_block_tkg``); docs/moe_block.md says where the block follows and
where it deliberately differs from it.

``prepare("moe_block", layer) -> prepared``;
``entry(x, residual, prepared, eps, out, out_residual, router_logits) -> None``.

- ``x (T, H)``; ``residual``, ``out_residual`` (both ``(T, H)``) and ``router_logits (T, E)``
  may be None. ``layer`` is a :class:`MoeBlockLayer`, owned by the validator.
- Semantics: ``s = x [+ residual]`` (rounded to the I/O dtype, written to
  ``out_residual``); ``h = rmsnorm(s)·gamma`` in fp32 once; router logits ``h·Wᵀ (+ bias)``;
  routing per the block config; ``out = routed_scaling_factor·Σ_routed coef·expert(h) + shared(h)``
  with ``coef`` = affinity (POST_SCALE) or 1 (NO_SCALE) over each token's routed set of this
  rank's experts. MX experts quantise the expert input and the intermediate to MXFP8 E4M3 (the
  seed's path), or take another conforming activation path of :data:`MX_PATHS`.
- Comparator: matched_ratio ≥ 0.97 on every output, default tolerances by output dtype. A token
  whose routing is a tie within the router path's rounding error, or whose MX experts may take
  several activation paths, must match the reference under one of its admissible (path, routing)
  pairs (:func:`moe_block_reference` with ``admissible=True``).

The trusted reference below is written independently of ``kernelslot.kernels``: it dequantises
with :mod:`kernelslot.formats`, runs every local expert on every token at once and combines them
with a dense coefficient sheet.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from kernelslot.abi import Arg, CallDescriptor, MatchedRatio, Role, Slot, SlotKind
from kernelslot.abi.comparators import AnyOfRows, default_tol, tie_partition, unit_roundoff
from kernelslot.formats.elements import to_e4m3
from kernelslot.formats.mx import dequantize_mx, quantize_mx
from kernelslot.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4
from kernelslot.kernels.moe_block import moe_block_tkg, prepare_moe_block
from kernelslot.kernels.experts_spec import ScalingMode
from kernelslot.kernels.moe_block.config import MoeBlockConfig, SharedExpert
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.slots.base import (LOW_BIT, Candidate, Case, Kernel, NearMiss, OutputSpec, Pick, Profile, SlotDef, Traffic,
                                   multiple_of, nbytes, output_traffic, randn)
from kernelslot.slots.models import MODELS
from kernelslot.slots.triton_variants import superseded_by, triton_variant

__all__ = ["MoeBlockLayer", "make_expert_weights", "moe_block_reference", "SLOT", "SLOTS"]


@dataclass(frozen=True)
class MoeBlockLayer:
    """The validator-owned view of one MoE layer handed to ``prepare("moe_block", layer)``.

    ``gamma (H,)`` is the effective RMSNorm weight (``1 + w`` for Gemma-style norms);
    ``router_weight (E, H)``; ``router_bias`` / ``correction_bias`` ``(E,)`` or None (the
    correction bias shifts selection only); ``experts`` holds this rank's ``E_L`` experts
    (global ids ``rank_id·E_L …``); ``shared`` is an optional shared expert; ``config`` carries
    K, router activation, ``router_pre_norm``, ``norm_topk_prob``, scaling mode, expert
    activation, ``routed_scaling_factor``, strategy hint, ``rank_id`` and ``E_L``.
    """

    gamma: torch.Tensor
    router_weight: torch.Tensor
    experts: ExpertWeights
    config: MoeBlockConfig
    router_bias: Optional[torch.Tensor] = None
    correction_bias: Optional[torch.Tensor] = None
    shared: Optional[SharedExpert] = None


# --------------------------------------------------------------------------- weight builders

_MX_ELEM = {"mxfp4": "fp4", "mxfp8": "fp8_e4m3"}


def _quantize_matrix(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """fp32 ``(E, rows, cols)`` -> (data, block/row scales, per-expert outer scale) in ``fmt``."""
    if fmt == "fp8_row":
        scale = w.abs().amax(dim=-1).clamp_min(1e-12) / 448.0
        return to_e4m3(w / scale.unsqueeze(-1)), scale, None
    if fmt in _MX_ELEM:
        data, scales = quantize_mx(w, _MX_ELEM[fmt])
        return data, scales, None
    if fmt == "nvfp4":
        parts = [quantize_nvfp4(w[e]) for e in range(w.shape[0])]
        return (
            torch.stack([p[0] for p in parts]),
            torch.stack([p[1] for p in parts]),
            torch.stack([p[2].reshape(()) for p in parts]).float(),
        )
    raise ValueError(f"unknown expert format {fmt!r}")


def make_expert_weights(
    fmt: str,
    num_experts: int,
    hidden: int,
    inter: int,
    gen: torch.Generator,
    dtype: torch.dtype,
    biases: bool = False,
    gate_scale: float = 1.0,
) -> ExpertWeights:
    """Random experts in ``fmt``: dense weights are ``dtype``; quantised ones are quantised from fp32 draws."""
    gate_up = randn((num_experts, 2 * inter, hidden), gen, torch.float32, gate_scale / hidden**0.5)
    down = randn((num_experts, hidden, inter), gen, torch.float32, 1.0 / inter**0.5)
    gu_bias = randn((num_experts, 2 * inter), gen, dtype, 0.1) if biases else None
    d_bias = randn((num_experts, hidden), gen, dtype, 0.1) if biases else None
    if fmt == "dense":
        return ExpertWeights("dense", gate_up.to(dtype), down.to(dtype), gate_up_bias=gu_bias, down_bias=d_bias)
    gu, gu_s, gu_o = _quantize_matrix(gate_up, fmt)
    dn, dn_s, dn_o = _quantize_matrix(down, fmt)
    return ExpertWeights(fmt, gu, dn, gu_s, dn_s, gu_o, dn_o, gate_up_bias=gu_bias, down_bias=d_bias)


# --------------------------------------------------------------------------- trusted reference


def _dequantize_reference(w: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """All experts as fp32 ``(E, 2I, H)``, ``(E, H, I)`` straight from the format codecs."""

    def one(data: torch.Tensor, scale: Optional[torch.Tensor], outer: Optional[torch.Tensor]) -> torch.Tensor:
        if w.format == "dense":
            return data.float()
        if w.format == "fp8_row":
            return data.float() * scale.reshape(data.shape[0], -1, 1).float()
        if w.format in _MX_ELEM:
            return dequantize_mx(data, scale, _MX_ELEM[w.format], torch.float32)
        return torch.stack([dequantize_nvfp4(data[e], scale[e], outer[e], torch.float32) for e in range(data.shape[0])])

    return one(w.gate_up, w.gate_up_scale, w.gate_up_outer), one(w.down, w.down_scale, w.down_outer)


def _mxfp8(x: torch.Tensor) -> torch.Tensor:
    data, scales = quantize_mx(x, "fp8_e4m3")
    return dequantize_mx(data, scales, "fp8_e4m3", torch.float32)


# How an MX expert may feed one activation (its input ``h``, or the gated intermediate) to a projection.
MX_ACTIVATION_TREATMENTS = {
    "fp32": lambda v: v,  # unquantised: the weight-only path
    "mxfp8": _mxfp8,  # MXFP8 E4M3 of the fp32 value (32-element blocks, floor scales)
    "bf16>mxfp8": lambda v: _mxfp8(v.to(torch.bfloat16).float()),  # rounded to bfloat16 first, then MXFP8
}


@dataclass(frozen=True)
class MxActivationPath:
    """One conforming way for an MX expert to treat its activations: ``input`` (what ``h`` becomes
    before gate/up) and ``intermediate`` (what the gated activation becomes before down), each a
    key of :data:`MX_ACTIVATION_TREATMENTS`. The weights are always dequantised exactly and every
    product accumulates in fp32."""

    name: str
    input: str
    intermediate: str


# The activation paths an MX block may take (docs/moe_block.md, "MX activation paths"). The reference
# computes ``out`` under each, and each token's row must match one of them (an AnyOfRows, as for
# routing ties). The first is the contract's (the canonical answer); the others are what engines run.
MX_PATHS: tuple[MxActivationPath, ...] = (
    MxActivationPath("mxfp8", "mxfp8", "mxfp8"),  # the seed's nc_matmul_mx path, from fp32 values
    MxActivationPath("weight-only", "fp32", "fp32"),  # MX weights, unquantised activations (Hopper-class MXFP4)
    MxActivationPath("bf16-first", "bf16>mxfp8", "bf16>mxfp8"),  # MXFP8 of the bf16 activations an engine holds
    MxActivationPath("bf16-first input", "bf16>mxfp8", "mxfp8"),  # bf16 h; intermediate quantised in the epilogue
    MxActivationPath("bf16-first intermediate", "mxfp8", "bf16>mxfp8"),  # fused norm+quant; a bf16 intermediate
)


def _glu(gu: torch.Tensor, act: ExpertActivation) -> torch.Tensor:
    inter = gu.shape[-1] // 2
    g, u = gu[..., :inter], gu[..., inter:]
    g = g.clamp(min=act.gate_clamp[0], max=act.gate_clamp[1]) if act.gate_clamp != (None, None) else g
    u = u.clamp(min=act.up_clamp[0], max=act.up_clamp[1]) if act.up_clamp != (None, None) else u
    a = {
        "silu": lambda: g * torch.sigmoid(g),
        "swish": lambda: g * torch.sigmoid(act.alpha * g),
        "swigluoai": lambda: g * torch.sigmoid(act.alpha * g),
        "gelu": lambda: F.gelu(g),
        "gelu_tanh": lambda: F.gelu(g, approximate="tanh"),
    }[act.kind]()
    return a * (u + act.up_bias)


def _all_experts_on_all_tokens(w: ExpertWeights, h: torch.Tensor, act: ExpertActivation,
                               paths: tuple[MxActivationPath, ...] = MX_PATHS[:1]) -> list[torch.Tensor]:
    """Per path, ``(T, E, H)``: every expert's output for every token, fp32. MX experts treat their
    activations as each of ``paths`` says; other formats have one answer (a list of one)."""
    mx = w.format in _MX_ELEM
    gate_up, down = _dequantize_reference(w)
    paths = paths if mx else paths[:1]

    def treat(key: str, v: torch.Tensor) -> torch.Tensor:
        return MX_ACTIVATION_TREATMENTS[key](v) if mx else v

    inter: dict[str, torch.Tensor] = {}  # one gate/up GEMM per input treatment
    for key in dict.fromkeys(p.input for p in paths):
        gu = torch.einsum("th,eoh->teo", treat(key, h), gate_up)
        if w.gate_up_bias is not None:
            gu = gu + w.gate_up_bias.float()
        inter[key] = _glu(gu, act)
    outs = []
    for p in paths:
        y = torch.einsum("tei,ehi->teh", treat(p.intermediate, inter[p.input]), down)
        outs.append(y + w.down_bias.float() if w.down_bias is not None else y)
    return outs


def moe_block_reference(
    x: torch.Tensor, residual: Optional[torch.Tensor], layer: MoeBlockLayer, eps: float, admissible: bool = False,
    skip_ranks: int = 0,
) -> dict[str, Any]:
    """fp32 ``out``, ``out_residual`` (when residual is given) and ``router_logits``.

    ``skip_ranks`` (a near-miss only, never the contract): each token routes to the experts ranked
    ``skip_ranks .. skip_ranks + K - 1`` instead of its best ``K``.

    ``out`` follows the contract's tie rule (lower expert index first) and, for MX experts, the
    seed's MXFP8 activation path. With ``admissible``, ``out`` is an :class:`AnyOfRows` where the
    contract leaves a choice: a token whose routing is a tie within the rounding error of the I/O
    dtype's router path (:func:`routing_band`) may take any admissible routing among the tied
    experts, and MX experts may take any activation path of :data:`MX_PATHS`; each token's row must
    equal the reference under one admissible (path, routing) pair.
    """
    cfg = layer.config
    s = x if residual is None else (x.double() + residual.double()).to(x.dtype)
    sd = s.double()
    h = (sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + eps) * layer.gamma.double()).float()
    logits = h.double() @ layer.router_weight.double().t()
    if layer.router_bias is not None:
        logits = logits + layer.router_bias.double()
    act = torch.sigmoid if cfg.router_activation == "sigmoid" else (lambda v: torch.softmax(v, dim=-1))
    scores = act(logits) if cfg.router_pre_norm else logits
    select = scores if layer.correction_bias is None else scores + layer.correction_bias.double()
    per_path = _all_experts_on_all_tokens(layer.experts, h, cfg.activation, MX_PATHS if admissible else MX_PATHS[:1])
    shared = None
    if layer.shared is not None:
        shared = _all_experts_on_all_tokens(layer.shared.weights, h, layer.shared.activation)[0][:, 0]
        if layer.shared.gate is not None:
            shared = shared * torch.sigmoid(h @ layer.shared.gate.float()).unsqueeze(1)

    def combine(order: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:  # (T, K) routed ids -> out (T, H)
        chosen = scores.gather(1, order)
        if not cfg.router_pre_norm:
            chosen = act(chosen)
        if cfg.norm_topk_prob:
            chosen = chosen / chosen.sum(-1, keepdim=True)
        if cfg.scaling is ScalingMode.NO_SCALE:
            chosen = torch.ones_like(chosen)
        coef = torch.zeros_like(logits).scatter_(1, order, chosen)  # (T, E) global
        lo = cfg.rank_id * cfg.num_local_experts
        out = cfg.routed_scaling_factor * torch.einsum("te,teh->th", coef[:, lo:lo + cfg.num_local_experts].float(), dense)
        return out if shared is None else out + shared

    order = torch.argsort(-select, dim=-1, stable=True)[:, skip_ranks:skip_ranks + cfg.top_k]  # lower index wins exact ties
    orders = order.unsqueeze(0)  # (A, T, K): the contract's routing first
    if admissible and cfg.top_k < select.shape[1]:
        sure, tied = tie_partition(select, routing_band(h, layer, logits, scores, x.dtype), cfg.top_k)
        routings = [[order[t].tolist()] for t in range(select.shape[0])]
        for t in tied.any(-1).nonzero().flatten().tolist():
            routings[t] += _other_routings(sure[t], tied[t], cfg.top_k, order[t].tolist())
        if any(len(r) > 1 for r in routings):
            n = max(len(r) for r in routings)
            orders = torch.tensor([[r[min(a, len(r) - 1)] for r in routings] for a in range(n)], dtype=torch.long)
    # every admissible routing under every admissible MX activation path; the contract's answer first
    choices = [combine(o, dense) for dense in per_path for o in orders]
    out: Any = choices[0] if len(choices) == 1 else AnyOfRows(torch.stack(choices))
    result = {"out": out, "router_logits": logits.float()}
    if residual is not None:
        result["out_residual"] = s.float()
    return result


MAX_ROUTINGS = 64  # admissible routings enumerated per token (ties of more experts keep the first ones)


def routing_band(h: torch.Tensor, layer: MoeBlockLayer, logits: torch.Tensor, scores: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """``(T, E)``: how far an honest kernel's selection score may sit from the fp64 reference's.

    The I/O-dtype path rounds ``h`` and the router logits to ``dtype`` (unit roundoff ``u``) and
    accumulates ``H`` products in fp32; the router activation (slope at most 1/4 for sigmoid; for
    softmax ``s_i`` times the row's largest logit error) and a correction-bias add round once more.
    The bound is doubled for slack; it is the path's rounding error, not a comparison tolerance.
    """
    cfg = layer.config
    u, u32, hidden = unit_roundoff(dtype), unit_roundoff(torch.float32), h.shape[-1]
    mag = h.double().abs() @ layer.router_weight.double().abs().t()
    if layer.router_bias is not None:
        mag = mag + layer.router_bias.double().abs()
    d_logit = u * (mag + logits.abs()) + hidden * u32 * mag
    if not cfg.router_pre_norm:
        d_score = d_logit
    elif cfg.router_activation == "sigmoid":
        d_score = d_logit / 4 + u * scores.abs()
    else:
        d_score = scores * 2 * d_logit.amax(-1, keepdim=True) + u * scores.abs()
    if layer.correction_bias is not None:
        d_score = d_score + u * (scores + layer.correction_bias.double()).abs()
    return 2 * d_score


def _other_routings(sure: torch.Tensor, tied: torch.Tensor, k: int, base: list[int]) -> list[list[int]]:
    """The admissible routings of one token (``k`` expert ids) other than ``base``."""
    fixed, free = sure.nonzero().flatten().tolist(), tied.nonzero().flatten().tolist()
    combos = itertools.islice(itertools.combinations(free, k - len(fixed)), MAX_ROUTINGS)
    return [r for r in (sorted(fixed + list(c)) for c in combos) if r != sorted(base)]


def _reference(case: Case) -> dict[str, Any]:
    inp = case.inputs
    return moe_block_reference(inp["x"], inp["residual"], case.prepare_args[1], inp["eps"], admissible=True)


# --------------------------------------------------------------------------- named near-misses


def _with_config(case: Case, **changes: Any) -> dict[str, Any]:
    """The reference (the contract's tie rule) of the case's layer with its config changed."""
    layer: MoeBlockLayer = case.prepare_args[1]
    changed = dataclasses.replace(layer, config=dataclasses.replace(layer.config, **changes))
    inp = case.inputs
    return moe_block_reference(inp["x"], inp["residual"], changed, inp["eps"])


def _renormalised(case: Case) -> dict[str, Any] | None:
    """Exercised where some token's routed affinities do not already sum to 1 within the I/O
    dtype's tolerance (there, renormalising them is the contract's answer within tolerance)."""
    layer: MoeBlockLayer = case.prepare_args[1]
    cfg = layer.config
    if cfg.norm_topk_prob or cfg.scaling is ScalingMode.NO_SCALE:
        return None
    inp = case.inputs
    logits = moe_block_reference(inp["x"], inp["residual"], layer, inp["eps"])["router_logits"].double()
    act = torch.sigmoid if cfg.router_activation == "sigmoid" else (lambda v: torch.softmax(v, dim=-1))
    scores = act(logits) if cfg.router_pre_norm else logits
    select = scores if layer.correction_bias is None else scores + layer.correction_bias.double()
    chosen = scores.gather(1, torch.argsort(-select, dim=-1, stable=True)[:, :cfg.top_k])
    sums = (chosen if cfg.router_pre_norm else act(chosen)).sum(-1)
    if bool(((sums - 1).abs() <= default_tol(inp["x"].dtype)).all()):
        return None
    return _with_config(case, norm_topk_prob=True)


def _scaling_twice(case: Case) -> dict[str, Any] | None:
    factor = case.prepare_args[1].config.routed_scaling_factor
    return None if factor == 1 else _with_config(case, routed_scaling_factor=factor * factor)


def _silu_for_swigluoai(case: Case) -> dict[str, Any] | None:
    layer: MoeBlockLayer = case.prepare_args[1]
    if layer.config.activation.kind != "swigluoai":
        return None
    silu = ExpertActivation("silu")
    shared = dataclasses.replace(layer.shared, activation=silu) if layer.shared is not None else None
    changed = dataclasses.replace(layer, config=dataclasses.replace(layer.config, activation=silu), shared=shared)
    return moe_block_reference(case.inputs["x"], case.inputs["residual"], changed, case.inputs["eps"])


def _best_expert_skipped(case: Case) -> dict[str, Any] | None:
    """Top-K taken one rank down (an off-by-one selection index): the best expert skipped."""
    layer: MoeBlockLayer = case.prepare_args[1]
    if layer.config.top_k >= layer.config.num_experts:
        return None
    inp = case.inputs
    return moe_block_reference(inp["x"], inp["residual"], layer, inp["eps"], skip_ranks=1)


NEAR_MISSES = (
    NearMiss("routing weights renormalised where the profile does not renormalise", _renormalised),
    NearMiss("routed_scaling_factor applied twice", _scaling_twice),
    NearMiss("SiLU for swigluoai", _silu_for_swigluoai),
    NearMiss("each token's best expert skipped (top-K taken one rank down)", _best_expert_skipped),
)


# --------------------------------------------------------------------------- cases and profiles

_ROUTERS = {"softmax": ("softmax", True), "sigmoid": ("sigmoid", True), "topk_softmax": ("softmax", False)}


def make_layer(profile: Profile, gen: torch.Generator) -> MoeBlockLayer:
    """The layer view for a profile: model facts from ``MODELS``, sizes and overrides from ``dims``."""
    d, m, dt = profile.dims, MODELS[profile.model], profile.dtype
    hidden, inter, num_experts, local = d["H"], d["I"], d["E"], d.get("E_L", d["E"])
    router_act, pre_norm = _ROUTERS[m.router]
    act = d.get("activation", m.activation)
    gate_scale = 3.0 if act.kind == "swigluoai" else 1.0  # reach the ±limit clamps
    biases = bool(d.get("biases", False))
    config = MoeBlockConfig(
        top_k=d["K"], num_experts=num_experts, num_local_experts=local, rank_id=d.get("rank", 0),
        router_activation=router_act, router_pre_norm=pre_norm,
        norm_topk_prob=d.get("norm_topk_prob", m.norm_topk_prob),
        scaling=d.get("scaling", ScalingMode.POST_SCALE), activation=act,
        routed_scaling_factor=m.routed_scaling_factor, strategy=d.get("strategy", "auto"),
    )
    gamma = (1.0 + randn((hidden,), gen, torch.float32, 0.1)).to(dt)  # Gemma's (1 + w) arrives folded
    router_weight = randn((num_experts, hidden), gen, dt, 2.0 / hidden**0.5)
    router_bias = randn((num_experts,), gen, dt, 0.2) if biases else None
    if d.get("skew") == "hot":  # ids are not inputs here: steer the router itself
        skew = hot_expert_bias(num_experts, local, d.get("rank", 0), gen)
        router_bias = (skew if router_bias is None else router_bias.float() + skew).to(dt)
    correction = randn((num_experts,), gen, torch.float32, 0.05) if m.correction_bias else None
    experts = make_expert_weights(d.get("format", "dense"), local, hidden, inter, gen, dt, biases, gate_scale)
    shared = None
    if d.get("shared", m.shared_expert):
        sw = make_expert_weights("dense", 1, hidden, inter, gen, dt, False, gate_scale)
        gate = randn((hidden,), gen, dt, 1.0 / hidden**0.5) if d.get("shared_gate") else None
        shared = SharedExpert(sw, act, gate)
    return MoeBlockLayer(gamma, router_weight, experts, config, router_bias, correction, shared)


# About 3 standard deviations of a profile's router logit (router rows scaled 2/sqrt(H)): enough that
# nearly every token routes to the hot expert, not so much that it takes all of a softmax's mass
# (then renormalising the top-K weights, a named near-miss, would change nothing).
HOT_LOGIT = 6.0


def hot_expert_bias(num_experts: int, local: int, rank: int, gen: torch.Generator) -> torch.Tensor:
    """fp32 ``(E,)`` router bias of the ``skew="hot"`` profiles: +HOT_LOGIT on one of this rank's
    experts (nearly every token routes to it: about 4x a balanced share at E=16, K=4), -HOT_LOGIT on
    half of the others (they get no tokens). The hot expert carries most of each token's weight."""
    bias = torch.zeros(num_experts)
    lo = rank * local
    order = (lo + torch.randperm(local, generator=gen)).tolist() + [e for e in range(num_experts) if not lo <= e < lo + local]
    bias[order[0]] = HOT_LOGIT
    bias[order[1::2]] = -HOT_LOGIT
    return bias


def _make_case(profile: Profile, gen: torch.Generator) -> Case:
    d, dt = profile.dims, profile.dtype
    tokens, hidden = d["T"], d["H"]
    layer = make_layer(profile, gen)
    x = randn((tokens, hidden), gen, dt)
    residual = randn((tokens, hidden), gen, dt) if d.get("residual") else None
    outputs = {
        "out": OutputSpec((tokens, hidden), dt),
        "out_residual": OutputSpec((tokens, hidden), dt) if residual is not None else None,
        "router_logits": OutputSpec((tokens, d["E"]), dt) if d.get("logits") else None,
    }
    return Case(
        inputs={"x": x, "residual": residual, "eps": 1e-6},
        outputs=outputs,
        prepare_args=("moe_block", layer),
        live=("x", "residual") if residual is not None else ("x",),
        meta={"model": profile.model, "gemma_norm": MODELS[profile.model].gemma_norm},
    )


def _draw(base: Profile, pick: Pick) -> dict:
    """Tokens, K, leaf strategy, router skew and optional outputs around ``base`` (same dtype,
    model, expert format, sizes and expert-parallel slice)."""
    return {"T": pick.integer(1, 64), "K": pick.integer(1, min(8, base.dims["E"])),
            "strategy": pick.choice(("selective", "all_expert", "auto")), "skew": pick.choice((None, "hot")),
            "residual": pick.flag(), "logits": pick.flag()}


def _describe(case: Case) -> CallDescriptor:
    layer: MoeBlockLayer = case.prepare_args[1]
    cfg, w = layer.config, layer.experts
    return CallDescriptor(
        phase="decode", num_tokens=case.inputs["x"].shape[0], top_k=cfg.top_k, hidden_size=w.hidden_size,
        intermediate_size=w.intermediate_size, num_experts=cfg.num_experts, quant=w.format,
        world_size=cfg.num_experts // cfg.num_local_experts,
    )


def _traffic(case: Case) -> Traffic:
    """x (and residual) read, every output written, the norm and router weights read whole (every
    token scores every expert): 2·E·H router flops per token. Routed experts are not counted (which
    are local depends on the routing)."""
    layer: MoeBlockLayer = case.prepare_args[1]
    x = case.inputs["x"]
    fixed = nbytes(x, case.inputs["residual"], layer.gamma, layer.router_weight) + output_traffic(case).bytes
    return Traffic(fixed, 2 * x.shape[0] * layer.router_weight.numel())


def _width(key: str):
    """A fit for H or I: quantised formats (MX, NVFP4, fp8 rows) keep a multiple of 32."""
    return lambda d, n: {**d, key: multiple_of(n, 32) if d.get("format", "dense") != "dense" else n}


def _experts(d: dict, n: int) -> dict:
    """A fit for num_experts (the model's E): the world size kept, so E is a multiple of it and
    each rank's slice E_L = E / world grows along (this rank keeps its index); K at most E."""
    world = d["E"] // d.get("E_L", d["E"])
    total = multiple_of(n, world)
    return {**d, "E": total, "K": min(d["K"], total), **({"E_L": total // world} if "E_L" in d else {})}


def _world(d: dict, n: int) -> dict | None:
    """A fit for world_size (the expert-parallel ranks): E kept and split into the divisor of E
    nearest ``n`` (so every rank holds E_L = E / world whole experts); this rank keeps its place
    in the expert order (rank·world'/world), so its slice is a part of the one it held."""
    total, world = d["E"], d["E"] // d.get("E_L", d["E"])
    new = min((w for w in range(1, total + 1) if total % w == 0), key=lambda w: (abs(math.log(w / n)), -w))
    return {**d, "E_L": total // new, "rank": d.get("rank", 0) * new // world}


# Envelope sizes (verify/envelope.py); top_k stays at most the experts, and the expert-parallel
# split stays whole (num_experts moves E with the world size kept; world_size moves E_L with E kept).
_SIZES = (("num_tokens", "T"), ("top_k", "K", lambda d, n: {**d, "K": n} if n <= d["E"] else None),
          ("hidden_size", "H", _width("H")), ("intermediate_size", "I", _width("I")),
          ("num_experts", "E", _experts), ("world_size", "E_L", _world))


# MX profiles: ``out`` is judged by the slot's matched_ratio against the nearest admissible answer, over
# the activation paths of MX_PATHS as well as the routings. One path's answer is not within tolerance of
# another's (an E4M3 boundary a hair from a value moves it a whole step: the seed's path alone rejects an
# honest weight-only kernel at margin 17-28); against its own, an honest kernel differs by accumulation
# order and bf16 operand rounding only: margin <= 0.12 over 30 seeds at T = 1, 2 and each profile's T, while
# the output rounded to 2 significant bits lands at >= 9.8 (docs/moe_block.md): low_bit_resolution 2.
# ``out_residual`` and ``router_logits`` do not cross the MX path and keep the slot's comparator.
MX_COMPARATOR = MatchedRatio(0.97, row_scaled_atol=True)


def _p(name: str, model: str, dtypes: tuple[torch.dtype, ...], **dims) -> tuple[Profile, ...]:
    mx = dims.get("format") in ("mxfp4", "mxfp8")
    return tuple(Profile(name, dims, dt, model, tags=frozenset({LOW_BIT}) if mx else frozenset(),
                         comparator={"out": MX_COMPARATOR} if mx else None) for dt in dtypes)


F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
_PROFILES: tuple[Profile, ...] = (
    # generic: softmax over all E, no renormalisation -> the keystone index mask is live (the keystone:
    # the seed's name for router_pre_norm ∧ ¬norm_topk_prob, the one case where the router leaves dense
    # affinities and the all-expert path must re-apply the top-K mask).
    *_p("t1_selective_dense", "generic", (F32, BF16, F16), T=1, H=128, I=64, E=8, K=2, strategy="selective",
        residual=True, logits=True),
    *_p("t7_all_expert_ep_rank1", "generic", (F32, BF16), T=7, H=128, I=64, E=16, E_L=8, rank=1, K=4,
        strategy="all_expert", logits=True),
    *_p("t128_auto_fp8_row", "generic", (F32,), T=128, H=128, I=64, E=8, K=2, format="fp8_row"),
    *_p("t5_no_scale_gelu_tanh_shared", "generic", (BF16,), T=5, H=96, I=48, E=8, E_L=4, rank=1, K=3,
        strategy="all_expert", scaling=ScalingMode.NO_SCALE, activation=ExpertActivation("gelu_tanh"),
        shared=True, shared_gate=True, residual=True),
    # qwen3-moe: softmax, top-K renormalised.
    *_p("t3_selective", "qwen3-moe", (F32, BF16, F16), T=3, H=256, I=64, E=16, K=4, strategy="selective",
        residual=True, logits=True),
    *_p("t32_all_expert_ep_mxfp8", "qwen3-moe", (BF16,), T=32, H=128, I=64, E=16, E_L=8, rank=1, K=4,
        format="mxfp8", strategy="all_expert", residual=True, logits=True),
    # gpt-oss: top-K on biased logits, softmax over the K; swigluoai; biases; MXFP4.
    *_p("t1_selective_mxfp4", "gpt-oss", (BF16,), T=1, H=128, I=64, E=8, K=4, format="mxfp4",
        strategy="selective", biases=True, logits=True),
    *_p("t16_all_expert_ep_mxfp4", "gpt-oss", (BF16,), T=16, H=128, I=64, E=16, E_L=4, rank=2, K=4,
        format="mxfp4", strategy="all_expert", biases=True, residual=True),
    *_p("t128_auto_mxfp4", "gpt-oss", (BF16,), T=128, H=128, I=64, E=16, K=4, format="mxfp4", biases=True, logits=True),
    # MiniMax-M3: sigmoid + correction bias, renormalised, ×2.0, shared expert, swigluoai.
    *_p("t1_selective_nvfp4", "MiniMax-M3", (F32, BF16), T=1, H=256, I=64, E=16, K=4, format="nvfp4",
        strategy="selective", residual=True, logits=True),
    *_p("t64_all_expert_ep_rank1", "MiniMax-M3", (F32, BF16, F16), T=64, H=128, I=32, E=16, E_L=8, rank=1, K=4,
        strategy="all_expert", residual=True),
    *_p("t4_selective_fp8_row", "MiniMax-M3", (F32,), T=4, H=128, I=64, E=16, K=4, format="fp8_row",
        strategy="selective", logits=True),
    *_p("t8_all_expert_ep_nvfp4", "MiniMax-M3", (BF16,), T=8, H=128, I=64, E=16, E_L=8, rank=1, K=4, format="nvfp4",
        strategy="all_expert", residual=True, logits=True),
    # structural routing (router bias steered: hot_expert_bias): one expert takes every token, many none
    *_p("t64_skew_hot_expert_selective", "generic", (F32, BF16), T=64, H=128, I=32, E=16, K=4, strategy="selective",
        skew="hot", logits=True),
    *_p("t48_skew_hot_expert_ep_all_expert", "MiniMax-M3", (BF16,), T=48, H=128, I=32, E=16, E_L=8, rank=1, K=4,
        strategy="all_expert", skew="hot", residual=True),
    *_p("t32_skew_hot_expert_mxfp4", "gpt-oss", (BF16,), T=32, H=128, I=64, E=16, K=4, format="mxfp4",
        strategy="selective", skew="hot", biases=True, logits=True),
)

SLOT = Slot(
    "moe.block_tkg",
    SlotKind.BLOCK,
    (
        Arg("x", Role.INPUT),
        Arg("residual", Role.INPUT, optional=True),
        Arg("prepared", Role.PREPARED),
        Arg("eps", Role.SCALAR),
        Arg("out", Role.OUTPUT),
        Arg("out_residual", Role.OUTPUT, optional=True),
        Arg("router_logits", Role.OUTPUT, optional=True),
    ),
    prepare_args=("kind", "layer"),
    summary="fused MoE decode block: residual + RMSNorm -> router top-K -> experts (+ shared), seed 003",
)

INCUMBENT = Kernel(entry=moe_block_tkg, prepare=prepare_moe_block, name="kernelslot.moe_block_tkg")
TRITON = triton_variant("moe_block", "moe_block_tkg", "prepare", name="triton.moe_block_tkg")

SLOTS: tuple[SlotDef, ...] = (
    SlotDef(
        slot=SLOT,
        make_case=_make_case,
        reference=_reference,
        # out: far from unit scale (routed scaling, shared expert), so its atol scales with the row's rms
        comparator={"out": MatchedRatio(0.97, row_scaled_atol=True), "out_residual": MatchedRatio(0.97),
                     "router_logits": MatchedRatio(0.97)},
        profiles=_PROFILES,
        incumbent=INCUMBENT,
        builtins=(TRITON, Candidate(INCUMBENT, needs=superseded_by(TRITON))),
        describe=_describe,
        prepared_state=("The layer view handed to prepare() is the same object every time, and so are its `experts` and "
                        "`shared` sub-objects: their identity (`id()`) must key nothing either."),
        sizes=_SIZES,
        traffic=_traffic,
        near_misses=NEAR_MISSES,
        draw=_draw,
        notes=("NO_SCALE sums each token's routed set (not the seed's non-zero columns); every given clamp applies. "
               "MX experts may take any activation path of " + ", ".join(p.name for p in MX_PATHS)
               + " (input / intermediate: " + ", ".join(f"{p.input} / {p.intermediate}" for p in MX_PATHS)
               + "); each token's `out` row must match the reference under one of them."),
        low_bit_resolution=2,  # MX profiles reject the output rounded to 1 and to 2 significant bits
    ),
)
