"""The registry of install points: where in a transformers model each slot is served.

An :class:`InstallPoint` has two functions. ``find(model, plan)`` returns the point's sites in the
model, or a string saying why the model has none whose semantics are the slot's (``kernelslot e2e``
reports it as "not run: <reason>"). ``place(model, sites, plan)`` installs the sites and returns a
:class:`Placed` (the slot's states, for counters and audits, and how to undo it). ``install()``
walks :data:`INSTALL_POINTS` in order; adding a slot is adding an entry, not a branch.

Order matters where two points want the same code: ``moe.block_tkg`` takes a layer's
post-attention norm and MoE block, so ``moe.fused_experts``, ``norm.rmsnorm`` and
``activation.silu_and_mul`` skip what it claimed; ``activation.silu_and_mul`` skips experts
modules when ``moe.fused_experts`` serves them.

Every point routes through the same :class:`~kernelslot.dispatch.SlotRouter` path: the plan's
``serving`` options (the sandboxed executor and the serving audits, for a bundle) and the verified
envelopes of the bundle's receipts (``plan.verified``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from kernelslot.engines.transformers import activation as act_point
from kernelslot.engines.transformers import attention as attn
from kernelslot.engines.transformers import block as block_point
from kernelslot.engines.transformers import norm as norm_point
from kernelslot.engines.transformers.experts import SLOT as EXPERTS_SLOT, CallContext, ExpertsState
from kernelslot.engines.transformers.sites import SlotState

NAME = "kernelslot"


@dataclass
class Plan:
    """What every point of one installation shares."""

    slots: tuple[str, ...]
    context: CallContext
    candidates: dict[str, list] = field(default_factory=dict)
    verified: dict[str, Optional[dict]] = field(default_factory=dict)
    serving: dict[str, Any] = field(default_factory=dict)
    weight_format: str = "auto"
    claimed: set[str] = field(default_factory=set)  # module names a point already serves
    attention: Optional[attn.AttentionState] = None

    def state(self, slot: str, incumbent: Any = None) -> SlotState:
        return SlotState(slot, self.candidates.get(slot, ()), self.context, self.verified.get(slot), self.serving,
                         incumbent)


@dataclass
class Placed:
    """What one point installed: its states (``counter_table()``, ``router``) and its undo steps."""

    slot: str
    states: list
    undo: list[Callable[[], None]] = field(default_factory=list)
    experts: dict[str, ExpertsState] = field(default_factory=dict)


@dataclass(frozen=True)
class InstallPoint:
    slot: str
    find: Callable[[torch.nn.Module, Plan], Any]  # sites, or a string: why the model has none
    place: Callable[[torch.nn.Module, Any, Plan], Placed]
    how: str  # one line for docs and `kernelslot e2e`: what the point replaces
    # The modules whose computation the slot takes over, as ``(name, casts back)``: e2e's floor runs
    # them in fp32 (an honest fp32-accumulating kernel's precision; ``casts back``: the region's
    # output is rounded to the model's dtype there). None: the point has no such module region.
    region: Optional[Callable[[torch.nn.Module], list[tuple[str, bool]]]] = None


def _swap(model: torch.nn.Module, name: str, new: torch.nn.Module) -> Callable[[], None]:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, child)
    setattr(parent, child, new)
    return lambda: setattr(parent, child, old)


# -- moe.block_tkg -----------------------------------------------------------------------------
def _block_find(model, plan):
    return block_point.find_sites(model)


def _block_region(model) -> list[tuple[str, bool]]:
    sites = block_point.find_sites(model)  # h = norm(x) stays fp32 into the router and experts
    return [] if isinstance(sites, str) else [
        r for name, _, _ in sites for r in ((f"{name}.post_attention_layernorm".lstrip("."), False),
                                            (f"{name}.mlp".lstrip("."), True))]


def _block_place(model, sites, plan) -> Placed:
    st = plan.state(block_point.SLOT)
    placed = Placed(block_point.SLOT, [st])
    for name, layer, (modes, tup) in sites:
        norm, mlp = layer.post_attention_layernorm, layer.mlp
        view = block_point.choose_layer(norm, mlp, modes)
        placed.undo.append(_swap(model, f"{name}.mlp" if name else "mlp",
                                 block_point.BlockSite(mlp, norm, view, st, tup)))
        placed.undo.append(_swap(model, f"{name}.post_attention_layernorm" if name else "post_attention_layernorm",
                                 block_point._PassThrough(norm)))
        plan.claimed.update({f"{name}.mlp", f"{name}.post_attention_layernorm"})
    return placed


# -- moe.fused_experts -------------------------------------------------------------------------
def experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every experts module of ``model`` that dispatches through transformers' experts interface."""
    return [(n, m) for n, m in model.named_modules()
            if hasattr(m, "gate_up_proj") and hasattr(m, "down_proj") and hasattr(type(m).forward, "__wrapped__")
            and hasattr(m, "has_gate")]


def _experts_find(model, plan):
    mods = [(n, m) for n, m in experts_modules(model) if not any(n.startswith(c + ".") for c in plan.claimed)]
    return mods or "no experts module dispatches through transformers' experts interface"


def _experts_region(model) -> list[tuple[str, bool]]:
    return [(n, True) for n, _ in experts_modules(model)]


def _reprepare_hook(state: ExpertsState):
    def hook(module, incompatible_keys):
        state.prepare(module)
    return hook


def _experts_place(model, sites, plan) -> Placed:
    placed = Placed(EXPERTS_SLOT, [])
    for name, m in sites:
        st = ExpertsState(m, plan.candidates.get(EXPERTS_SLOT, ()), context=plan.context,
                          weight_format=plan.weight_format, verified=plan.verified.get(EXPERTS_SLOT),
                          serving=plan.serving)
        m._kernelslot_experts = st
        placed.experts[name] = st
        placed.states.append(st)
        placed.undo.append(m.register_load_state_dict_post_hook(_reprepare_hook(st)).remove)
        placed.undo.append(lambda m=m: m.__dict__.pop("_kernelslot_experts", None))
    previous = model.config._experts_implementation
    model.set_experts_implementation(NAME)
    placed.undo.append(lambda: model.set_experts_implementation(previous))
    return placed


# -- attention.sdpa / attention.decode ---------------------------------------------------------
def _attention_find(model, plan):
    return attn.find_sites(model)


def _attention_place(slot: str):
    def place(model, sites, plan) -> Placed:
        st = plan.state(slot)
        placed = Placed(slot, [st])
        if plan.attention is None:  # the first attention point sets the model up; the second joins it
            plan.attention = attn.AttentionState(context=plan.context)
            for _, m in sites:
                m._kernelslot_attention = plan.attention
                placed.undo.append(lambda m=m: m.__dict__.pop("_kernelslot_attention", None))
            previous = model.config._attn_implementation
            model.set_attn_implementation(NAME)
            placed.undo.append(lambda: model.set_attn_implementation(previous))
        setattr(plan.attention, "sdpa" if slot == attn.SLOT else "decode", st)
        return placed
    return place


# -- norm.rmsnorm ------------------------------------------------------------------------------
def _norm_find(model, plan):
    return norm_point.find_sites(model, plan.claimed)


def _norm_region(model) -> list[tuple[str, bool]]:
    sites = norm_point.find_sites(model, set())
    return [] if isinstance(sites, str) else [(n, True) for n, _, _ in sites]


def _norm_place(model, sites, plan) -> Placed:
    st = plan.state(norm_point.SLOT)
    placed = Placed(norm_point.SLOT, [st])
    for name, m, kind in sites:
        placed.undo.append(_swap(model, name, norm_point.RMSNormSite(m, kind, st)))
    return placed


# -- activation.silu_and_mul -------------------------------------------------------------------
def _act_find(model, plan):
    return act_point.find_sites(model, plan.claimed, EXPERTS_SLOT in plan.slots)


def _act_place(model, sites, plan) -> Placed:
    st = plan.state(act_point.SLOT)
    placed = Placed(act_point.SLOT, [st])
    experts = [m for _, m, kind in sites if kind == "experts"]
    for name, m, kind in sites:
        if kind == "mlp":
            placed.undo.append(_swap(model, name, act_point.GatedMLPSite(m, st)))
        else:
            act_point.bind_experts_gate(m, st)
            placed.undo.append(lambda m=m: act_point.unbind_experts_gate(m))
    previous = model.config._experts_implementation
    if experts and previous == "eager":  # eager inlines act_fn(gate)·up; batched_mm calls _apply_gate
        model.set_experts_implementation("batched_mm")
        placed.undo.append(lambda: model.set_experts_implementation(previous))
    return placed


INSTALL_POINTS: dict[str, InstallPoint] = {p.slot: p for p in (
    InstallPoint(block_point.SLOT, _block_find, _block_place,
                 "a decoder layer's post-attention RMSNorm + sparse MoE block (module replacement)", _block_region),
    InstallPoint(EXPERTS_SLOT, _experts_find, _experts_place,
                 "transformers' ExpertsInterface (experts_implementation='kernelslot')", _experts_region),
    InstallPoint(attn.SLOT, _attention_find, _attention_place(attn.SLOT),
                 "transformers' AttentionInterface: prefill and decode calls that fit"),
    InstallPoint(attn.DECODE_SLOT, _attention_find, _attention_place(attn.DECODE_SLOT),
                 "transformers' AttentionInterface: single-query decode calls (dense cache as paged)"),
    InstallPoint(norm_point.SLOT, _norm_find, _norm_place, "every RMSNorm module (module replacement)",
                 _norm_region),
    InstallPoint(act_point.SLOT, _act_find, _act_place,
                 "gated MLPs (module replacement) and SiLU experts' _apply_gate"),
)}
SLOTS = tuple(INSTALL_POINTS)


def not_run_reasons(model: torch.nn.Module, slots: tuple[str, ...]) -> dict[str, str]:
    """slot -> why ``model`` has no site for it (only the slots that have none)."""
    plan = Plan(tuple(slots), CallContext())
    out = {}
    for slot, point in INSTALL_POINTS.items():
        if slot in slots:
            sites = point.find(model, plan)
            if isinstance(sites, str):
                out[slot] = sites
    return out
