"""The ``moe.fused_experts`` adapter: one prepared state per transformers experts module.

:class:`ExpertsState` holds, for one weight version of one module, everything a served call
needs: the normalised :class:`ExpertWeights` (with the native layout attached by the
built-in's prepare), the probed activation, the model profile whose semantics the module's
calls have at the slot, and — when candidates are installed — a :class:`SlotRouter` over
them with every variant prepared. A call builds a :class:`CallDescriptor`; a candidate whose
(effective) domain covers it runs through the router (which falls back to the built-in if the
candidate raises); otherwise the built-in serves it; a module the built-in cannot express
(no gate, unknown activation, post-expert norm) runs the model's own code.

Call semantics (transformers' experts contract): ``hidden (T, H)``, ``top_k_index (T, K)``,
``top_k_weights (T, K)`` -> ``Σ_k w·expert(hidden)`` in the hidden dtype. Expert-parallel
placeholder ids (``>= num_experts``, or negative) contribute nothing: they become ``-1``.

Candidate calls follow the slot ABI exactly: ``prepare(w13 (E, 2I, H), w2 (E, H, I))`` in the
model dtype, then ``entry(x, topk_ids int32, topk_weights fp32, prepared, out)``. Modules with
biases (GPT-OSS) are expressed losslessly without changing the slot: the gate/up bias becomes
one more contraction column (``x' = [x, 1, 0…]``, ``w13' = [w13 | b13 | 0…]``, padded to a
multiple of 32; ``w2'`` gains zero rows) and the down bias ``Σ_k w·b2[e]`` is added by the
adapter; the call's semantics are then the bias-free swigluoai profile.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from kernelslot.abi import CallDescriptor
from kernelslot.kernels.moe_block import ExpertActivation, ExpertWeights, fused_experts_forward
from kernelslot.kernels.moe_block.experts_dispatch import attach_fast_paths
from kernelslot.slots.base import Candidate, Kernel, dtype_name

from kernelslot.engines.transformers.layout import describe_module, expert_weights, probe_activation

SLOT = "moe.fused_experts"
BUILTIN = "builtin"
MODEL_CODE = "model"  # the module's own forward served the call
_SWIGLUOAI_PROFILE = ExpertActivation.swigluoai(1.702, 7.0)
_PAD = 32


@dataclass
class CallCounters:
    """Per variant: ``fired`` calls routed to it (``fired_decode`` of them in decode steps),
    ``completed`` cleanly, ``fallback`` recomputed by another implementation after it raised."""

    fired: int = 0
    fired_decode: int = 0
    completed: int = 0
    fallback: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, other: "CallCounters") -> None:
        self.fired += other.fired
        self.fired_decode += other.fired_decode
        self.completed += other.completed
        self.fallback += other.fallback
        self.errors.extend(other.errors)

    def as_dict(self) -> dict[str, Any]:
        return {"fired": self.fired, "fired_decode": self.fired_decode, "completed": self.completed,
                "fallback": self.fallback, "errors": list(self.errors[:5])}


@dataclass
class CallContext:
    """What the model-level hook knows about the current forward: phase and batch size."""

    phase: Optional[str] = None
    batch_size: Optional[int] = None


def weight_key(module: torch.nn.Module) -> tuple:
    """A cheap key that changes whenever the module's expert weights may have changed:
    parameter identity, storage address (``.to()``, reassignment), version counter (in-place
    updates, ``load_state_dict``), dtype, device, shape."""
    out = []
    for name in ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"):
        p = getattr(module, name, None)
        if not isinstance(p, torch.Tensor):
            continue
        try:
            version = p._version
        except RuntimeError:  # inference tensors carry no version counter (and cannot be updated in place)
            version = -1
        out.append((name, id(p), p.data_ptr(), version, p.dtype, p.device, tuple(p.shape)))
    return tuple(out)


def semantic_profile(act: ExpertActivation, has_bias: bool) -> Optional[str]:
    """The slot profile whose semantics a call has (after bias folding): SiLU -> ``generic``,
    swigluoai(1.702, 7) -> ``MiniMax-M3``; anything else has no profile (no candidate serves it)."""
    if act == ExpertActivation("silu"):
        return "generic"
    if act == _SWIGLUOAI_PROFILE:
        return "MiniMax-M3"
    return None


def _builtin_kernel(act: ExpertActivation) -> Kernel:
    """The built-in as the router's incumbent on ABI arguments (used only if a candidate raises)."""

    def prepare(w13: torch.Tensor, w2: torch.Tensor) -> ExpertWeights:
        return ExpertWeights("dense", w13, w2)  # torch leaves: no second native copy for a rare path

    def entry(x, topk_ids, topk_weights, prepared, out) -> None:
        fused_experts_forward(x, topk_ids, topk_weights, prepared, act, out)

    return Kernel(entry, prepare, name=f"builtin.fused_experts[{act.kind}]")


def _fold_biases(w: ExpertWeights, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """ABI-form ``(w13', w2')`` with the gate/up bias as an extra contraction column."""
    e, two_i, h = w.gate_up.shape
    w13 = torch.zeros(e, two_i, h + _PAD, dtype=dtype)
    w13[:, :, :h] = w.gate_up
    w13[:, :, h] = w.gate_up_bias.to(dtype)
    w2 = torch.zeros(e, h + _PAD, w.down.shape[2], dtype=dtype)
    w2[:, :h] = w.down
    return w13, w2


class ExpertsState:
    """Everything one experts module needs to serve calls for its current weight version."""

    def __init__(self, module: torch.nn.Module, candidates: Sequence[Candidate] = (), *,
                 context: Optional[CallContext] = None, weight_format: str = "auto", verified: Optional[dict] = None,
                 serving: Optional[dict] = None):
        self.candidates = list(candidates)
        self.verified = verified  # variant -> its verified envelope (a Staircase); routes only inside it
        self.serving = serving or {}  # SlotRouter options: executor, audits, audit_floor (installation.py)
        self.context = context or CallContext()
        self.weight_format = weight_format
        self.counters: dict[str, CallCounters] = {BUILTIN: CallCounters(), MODEL_CODE: CallCounters()}
        self._lock = threading.Lock()
        self.key: tuple = ()
        self.prepare(module)

    def __deepcopy__(self, memo):  # a copied module is not installed: it prepares its own state lazily
        return None

    # -- preparation (install time, and again whenever the weights change) ---------------------
    def prepare(self, module: torch.nn.Module) -> None:
        from kernelslot.engines.transformers.mxfp4 import wants_mxfp4, requantize_mxfp4

        flags = describe_module(module)
        self.num_experts = int(module.gate_up_proj.shape[0])
        self.act = probe_activation(module)
        self.has_bias = flags["has_bias"]
        self.profile = semantic_profile(self.act, self.has_bias) if self.act is not None else None
        self.router = self.routed = None
        self.weights = None
        if self.act is None:
            self.key = weight_key(module)
            return
        dense = expert_weights(module)
        self.hidden_size, self.intermediate_size = dense.hidden_size, dense.intermediate_size
        self.down_bias = dense.down_bias
        weights = requantize_mxfp4(dense) if wants_mxfp4(module, self.weight_format) else dense
        attach_fast_paths(weights)  # the built-in's prepare: native layout, once per weight version
        self.weights = weights
        if self.candidates and self.profile is not None:
            self._prepare_router(dense, module.gate_up_proj.dtype)
        self.key = weight_key(module)  # the dense copy (if one was made) is dropped here

    def _prepare_router(self, dense: ExpertWeights, dtype: torch.dtype) -> None:
        from kernelslot.dispatch import SlotRouter
        from kernelslot.slots import get_slot

        old = self.router
        self.router = SlotRouter(get_slot(SLOT), self.candidates, _builtin_kernel(self.act), verified=self.verified,
                                 **self.serving)
        if old is not None:  # keep the counts across re-prepares
            for name, r in old.counters.items():
                self.router.counters[name] = r
        if self.has_bias:
            w13, w2 = _fold_biases(dense, dtype)
        else:
            w13, w2 = dense.gate_up.to(dtype), dense.down.to(dtype)
        self.routed = self.router.prepare(w13, w2)

    # -- serving --------------------------------------------------------------------------------
    def descriptor(self, hidden: torch.Tensor, top_k: int) -> CallDescriptor:
        h = self.hidden_size + (_PAD if self.has_bias else 0)
        return CallDescriptor(model=self.profile, phase=self.context.phase, dtype=dtype_name(hidden.dtype),
                              num_tokens=hidden.shape[0], batch_size=self.context.batch_size, top_k=top_k,
                              hidden_size=h, intermediate_size=self.intermediate_size,
                              num_experts=self.num_experts, quant="dense", arch=hidden.device.type,
                              last_dim=h)

    def _count(self, variant: str, **delta: int) -> None:
        with self._lock:
            r = self.counters.setdefault(variant, CallCounters())
            for k, v in delta.items():
                setattr(r, k, getattr(r, k) + v)

    def __call__(self, module: torch.nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> torch.Tensor:
        if weight_key(module) != self.key:  # in-place update or .to() since the last prepare
            self.prepare(module)
        decode = int(self.context.phase == "decode")
        if self.weights is None or hidden.device.type != self.weights.gate_up.device.type:
            self._count(MODEL_CODE, fired=1, fired_decode=decode, completed=1)
            return type(module).forward.__wrapped__(module, hidden, top_k_index, top_k_weights)
        ids = torch.where((top_k_index < 0) | (top_k_index >= self.num_experts), -1, top_k_index)
        weights = top_k_weights.float()
        if self.router is not None:
            desc = self.descriptor(hidden, ids.shape[1])
            name = self.router.route(desc)
            if name != "incumbent":
                self._count(name, fired=1, fired_decode=decode)
                return self._candidate_call(desc, hidden, ids.to(torch.int32), weights)
        self._count(BUILTIN, fired=1, fired_decode=decode)
        out = torch.empty_like(hidden)
        try:
            fused_experts_forward(hidden, ids, weights, self.weights, self.act, out)
        except Exception as exc:  # the model's own code recomputes the call
            with self._lock:
                self.counters[BUILTIN].fallback += 1
                self.counters[BUILTIN].errors.append(f"{type(exc).__name__}: {exc}")
            return type(module).forward.__wrapped__(module, hidden, top_k_index, top_k_weights)
        self._count(BUILTIN, completed=1)
        return out

    def _candidate_call(self, desc: CallDescriptor, hidden: torch.Tensor, ids: torch.Tensor,
                        weights: torch.Tensor) -> torch.Tensor:
        t, h = hidden.shape
        if not self.has_bias:
            out = torch.empty_like(hidden)
            self.router(desc, hidden, ids, weights, self.routed, out)
            return out
        x = torch.zeros(t, h + _PAD, dtype=hidden.dtype, device=hidden.device)
        x[:, :h] = hidden
        x[:, h] = 1
        out = torch.empty_like(x)
        self.router(desc, x, ids, weights, self.routed, out)
        bias = self.down_bias[ids.clamp(min=0).long()] * (weights * (ids >= 0)).unsqueeze(-1)
        return (out[:, :h].float() + bias.sum(1)).to(hidden.dtype)

    def counter_table(self) -> dict[str, CallCounters]:
        """Per variant; candidates' ``completed``/``fallback``/errors come from the router."""
        table = {k: CallCounters(**{**v.__dict__, "errors": list(v.errors)}) for k, v in self.counters.items()}
        if self.router is not None:
            for name, r in self.router.counters.items():
                if name in table and name not in (BUILTIN, MODEL_CODE):
                    table[name].completed, table[name].fallback = r.completed, r.fallback
                    table[name].errors = list(r.errors)
        return table


def kernelslot_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                               top_k_weights: torch.Tensor) -> torch.Tensor:
    """The function registered as ``experts_implementation="kernelslot"``.

    Without :func:`install` the module is prepared lazily on its first call (built-in kernels
    only, once per weight version); with it, the installed state serves the call.
    """
    state = getattr(module, "_kernelslot_experts", None)
    if state is None:
        state = ExpertsState(module)
        module._kernelslot_experts = state
    return state(module, hidden_states, top_k_index, top_k_weights)
