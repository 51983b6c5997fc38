"""``register()``, ``install()`` and the installation handle.

``register()`` adds ``"kernelslot"`` to transformers' experts interface (and its FP8 experts
interface), attention interface and attention-mask interface (the mask builder is ``sdpa``'s,
so masks are None exactly where the call is plain causal). After it, ``experts_implementation=
"kernelslot"`` at load, or ``model.set_experts_implementation("kernelslot")`` at run time,
serves the built-in kernels.

``install(model, bundle=None, slots=...)`` goes further: it prepares every experts module up
front (weights normalised, activation probed, native layout built, each candidate's
``prepare`` run), switches the model to ``"kernelslot"``, tracks the phase of each forward
(prefill / decode, batch size) for the call descriptors, re-prepares a module eagerly after
``load_state_dict`` (and lazily, on its next call, after ``.to()`` or an in-place update: the
weight key changes), and returns an :class:`Installation` with per-slot call counters and
``uninstall()``. A bundle is installed only if the result store holds a passing ``verify``
receipt for its content hash and slot, unless ``trust_unverified=True``; a variant is then routed only
inside its declared domain ∩ the verified envelope that receipt recorded (a receipt that recorded
none, made without ``envelope``, leaves the declared domain).

Where a bundle runs (``trust``): ``"sandbox"`` (the default) serves it from a sandboxed
:class:`~kernelslot.isolation.executor.Executor`, the same kind of worker it was verified in, with
audits in this process (dispatch/router.py: calls 1, 2, 4, ... of every signature and
``audit_floor`` of the rest, recomputed by the built-in and compared). ``"in-process"`` imports the
bundle into this process: faster by the executor's round trip, but the bundle can then reach and
rewrite everything here (the router, its audits, the receipts, the engine), so no verdict about it
holds; it is logged as such. Built-in kernels always run in-process.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import torch

from kernelslot.engines.transformers import attention as attn
from kernelslot.engines.transformers.experts import SLOT as EXPERTS_SLOT, CallContext, CallCounters, ExpertsState

NAME = "kernelslot"
SLOTS = (EXPERTS_SLOT, attn.SLOT)
TRUST_MODES = ("sandbox", "in-process")
AUDIT_FLOOR = 1 / 64  # share of a signature's calls audited beyond the powers of two
log = logging.getLogger("kernelslot.engines")


class NotVerifiedError(RuntimeError):
    """A bundle without a passing verify receipt for its content hash was asked to be installed."""


def register() -> None:
    """Make ``"kernelslot"`` a valid experts / FP8 experts / attention / mask implementation."""
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from kernelslot.engines.transformers.experts import kernelslot_experts_forward

    ALL_EXPERTS_FUNCTIONS.register(NAME, kernelslot_experts_forward)
    # FP8 experts modules keep their own (block-scaled) weights, which this adapter does not
    # read: the FP8 interface's "kernelslot" entry serves them with transformers' grouped_mm
    # FP8 path, so selecting "kernelslot" model-wide never breaks an FP8 checkpoint.
    ALL_FP8_EXPERTS_FUNCTIONS.register(NAME, ALL_FP8_EXPERTS_FUNCTIONS["grouped_mm"])
    ALL_ATTENTION_FUNCTIONS.register(NAME, attn.kernelslot_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every experts module of ``model`` that dispatches through transformers' experts interface."""
    return [(n, m) for n, m in model.named_modules()
            if hasattr(m, "gate_up_proj") and hasattr(m, "down_proj") and hasattr(type(m).forward, "__wrapped__")
            and hasattr(m, "has_gate")]


@dataclass
class Installation:
    """What :func:`install` did; ``counters()`` per slot and variant, ``uninstall()`` undoes it."""

    model: torch.nn.Module
    slots: tuple[str, ...]
    states: dict[str, ExpertsState]
    context: CallContext
    previous: dict[str, Any]
    bundle_hash: Optional[str] = None
    attention: Optional[attn.AttentionState] = None
    _hooks: list = field(default_factory=list)
    installed: bool = True
    executor: Any = None  # the sandboxed executor serving the bundle (trust="sandbox")

    def mismatches(self) -> list:
        """Every audit mismatch so far (dispatch.router.AuditMismatch), in every slot."""
        routers = [st.router for st in self.states.values() if st.router is not None]
        routers += [self.attention.router] if self.attention is not None else []
        return [m for r in routers for c in r.counters.values() for m in c.mismatches]

    def counters(self) -> dict[str, dict[str, dict[str, Any]]]:
        out: dict[str, dict[str, dict[str, Any]]] = {}
        if EXPERTS_SLOT in self.slots:
            total: dict[str, CallCounters] = {}
            for st in self.states.values():
                for name, r in st.counter_table().items():
                    total.setdefault(name, CallCounters()).add(r)
            out[EXPERTS_SLOT] = {k: v.as_dict() for k, v in total.items()}
        if self.attention is not None:
            out[attn.SLOT] = {k: v.as_dict() for k, v in self.attention.counter_table().items()}
        return out

    def uninstall(self) -> None:
        """Restore the model's previous implementations and drop every prepared state."""
        if not self.installed:
            return
        for h in self._hooks:
            h.remove()
        for m in self.model.modules():
            m.__dict__.pop("_kernelslot_experts", None)
            m.__dict__.pop("_kernelslot_attention", None)
        if "experts" in self.previous:
            self.model.set_experts_implementation(self.previous["experts"])
        if "attn" in self.previous:
            self.model.set_attn_implementation(self.previous["attn"])
        if self.executor is not None:
            self.executor.close()
        self.installed = False


def _phase_hook(context: CallContext):
    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        past = kwargs.get("cache", kwargs.get("past_key_values"))
        seen = past.get_seq_length() if past is not None and hasattr(past, "get_seq_length") else 0
        context.batch_size = int(ids.shape[0]) if ids is not None else None
        context.phase = "decode" if seen > 0 else "prefill"
    return hook


def _reprepare_hook(state: ExpertsState):
    def hook(module, incompatible_keys):
        state.prepare(module)
    return hook


def install(model: torch.nn.Module, bundle: Any = None, slots: Iterable[str] = (EXPERTS_SLOT,), *,
            store: Optional[str] = None, trust_unverified: bool = False, weight_format: str = "auto",
            trust: str = "sandbox", audit_floor: float = AUDIT_FLOOR) -> Installation:
    """Install kernelslot's built-ins (or ``bundle``'s candidates) into ``model``.

    ``bundle``: a loaded :class:`kernelslot.bundle.Bundle`, a bundle directory, or None (built-ins).
    ``slots``: which of :data:`SLOTS` to serve. ``store``: the result store holding verify
    receipts (required with a bundle unless ``trust_unverified``). ``weight_format``:
    ``auto`` (MXFP4 when the checkpoint was MXFP4), ``dense`` or ``mxfp4`` (re-quantised
    losslessly; raises if not exact). ``trust``: where a bundle runs, ``"sandbox"`` (a sandboxed
    executor, audited here) or ``"in-process"`` (gives up every guarantee; see the module docstring).
    ``audit_floor``: the share of calls audited beyond calls 1, 2, 4, ... of each signature.
    """
    slots = tuple(slots)
    if trust not in TRUST_MODES:
        raise ValueError(f"install: trust must be one of {', '.join(TRUST_MODES)}, got {trust!r}")
    unknown = [s for s in slots if s not in SLOTS]
    if unknown:
        raise ValueError(f"install: unknown slot(s) {unknown}; this engine serves {', '.join(SLOTS)}")
    register()
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    candidates, bundle_hash, verified = _bundle_candidates(bundle, slots, store, trust_unverified, dtype)
    serving: dict[str, Any] = {}
    executor = None
    if candidates:
        serving = {"audits": True, "audit_floor": audit_floor}
        if trust == "sandbox":
            from kernelslot.isolation.executor import Executor

            executor = serving["executor"] = Executor()
        else:
            log.warning("kernelslot: bundle %s runs in this process (trust='in-process'): it can rewrite the router, "
                        "its audits and the receipts, so neither its verify receipt nor the audits hold", bundle_hash[:12])
    context = CallContext()
    modules = experts_modules(model)
    previous: dict[str, Any] = {}
    states: dict[str, ExpertsState] = {}
    hooks = []
    if EXPERTS_SLOT in slots:
        if not modules:
            raise ValueError(f"install: {type(model).__name__} has no experts module using transformers' experts "
                             "interface; nothing to serve for moe.fused_experts")
        for name, m in modules:
            st = ExpertsState(m, candidates.get(EXPERTS_SLOT, ()), context=context, weight_format=weight_format,
                              verified=verified.get(EXPERTS_SLOT), serving=serving)
            m._kernelslot_experts = st
            states[name] = st
            hooks.append(m.register_load_state_dict_post_hook(_reprepare_hook(st)))
        previous["experts"] = model.config._experts_implementation
        model.set_experts_implementation(NAME)
    handle = Installation(model, slots, states, context, previous, bundle_hash, _hooks=hooks, executor=executor)
    if attn.SLOT in slots:
        handle.attention = attn.AttentionState(candidates.get(attn.SLOT, ()), context, verified=verified.get(attn.SLOT),
                                               serving=serving)
        for m in model.modules():
            if hasattr(m, "is_causal"):  # the attention modules: they read the state in the call
                m._kernelslot_attention = handle.attention
        previous["attn"] = model.config._attn_implementation
        model.set_attn_implementation(NAME)
    hooks.append(model.register_forward_pre_hook(_phase_hook(context), with_kwargs=True))
    return handle


def _bundle_candidates(bundle: Any, slots: tuple[str, ...], store: Optional[str], trust_unverified: bool,
                       dtype: torch.dtype):
    if bundle is None:
        return {}, None, {}
    from kernelslot.abi.capability import Staircase
    from kernelslot.bundle import load_bundle
    from kernelslot.store.receipts import passing_slots, verified_envelopes

    if not hasattr(bundle, "candidates"):
        bundle = load_bundle(bundle)
    offered = {s: c for s, c in bundle.candidates().items() if s in slots}
    if not offered:
        raise ValueError(f"install: bundle {bundle.bundle_id} has no op for {', '.join(slots)}")
    if not trust_unverified:
        dt = str(dtype).removeprefix("torch.")
        passed = passing_slots(store, bundle.content_hash, dt) if store else set()
        missing = sorted(set(offered) - passed)
        if missing:
            raise NotVerifiedError(
                f"bundle {bundle.bundle_id} (sha256 {bundle.content_hash[:12]}…) has no passing verify receipt for "
                f"{', '.join(missing)} in {dt} in {store or 'the result store (none given)'}; run `kernelslot verify "
                f"{bundle.manifest.root} --store FILE` first, or pass trust_unverified=True")
    verified = {}
    for slot in offered if store and not trust_unverified else ():
        envelopes = verified_envelopes(store, bundle.content_hash, slot, str(dtype).removeprefix("torch."))
        verified[slot] = {name: Staircase.from_json(env) for name, env in envelopes.items()} or None
    return offered, bundle.content_hash, verified
