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
from kernelslot.engines.transformers.install_points import (INSTALL_POINTS, NAME, SLOTS, Placed, Plan,
                                                            experts_modules)

TRUST_MODES = ("sandbox", "in-process")
AUDIT_FLOOR = 1 / 64  # share of a signature's calls audited beyond the powers of two
log = logging.getLogger("kernelslot.engines")

__all__ = ["register", "install", "Installation", "NotVerifiedError", "SLOTS", "experts_modules"]


class NotVerifiedError(RuntimeError):
    """A bundle without a passing verify receipt for its content hash was asked to be installed."""


class NoSiteError(ValueError):
    """A requested slot has no install site in the model (the message says why)."""


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


@dataclass
class Installation:
    """What :func:`install` did; ``counters()`` per slot and variant, ``uninstall()`` undoes it."""

    model: torch.nn.Module
    slots: tuple[str, ...]
    placed: dict[str, Placed]
    context: CallContext
    bundle_hash: Optional[str] = None
    _hooks: list = field(default_factory=list)
    installed: bool = True
    executor: Any = None  # the sandboxed executor serving the bundle (trust="sandbox")

    @property
    def states(self) -> dict[str, ExpertsState]:
        """The experts modules' states, by module name (``moe.fused_experts``)."""
        p = self.placed.get(EXPERTS_SLOT)
        return p.experts if p is not None else {}

    def routers(self) -> list:
        return [st.router for p in self.placed.values() for st in p.states if st.router is not None]

    def mismatches(self) -> list:
        """Every audit mismatch so far (dispatch.router.AuditMismatch), in every slot."""
        return [m for r in self.routers() for c in r.counters.values() for m in c.mismatches]

    def counters(self) -> dict[str, dict[str, dict[str, Any]]]:
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for slot, p in self.placed.items():
            total: dict[str, CallCounters] = {}
            for st in p.states:
                for name, r in st.counter_table().items():
                    total.setdefault(name, CallCounters()).add(r)
            out[slot] = {k: v.as_dict() for k, v in total.items()}
        return out

    def uninstall(self) -> None:
        """Restore the model's previous modules and implementations and drop every prepared state."""
        if not self.installed:
            return
        for h in self._hooks:
            h.remove()
        for p in reversed(list(self.placed.values())):
            for undo in reversed(p.undo):
                undo()
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


def install(model: torch.nn.Module, bundle: Any = None, slots: Iterable[str] = (EXPERTS_SLOT,), *,
            store: Optional[str] = None, trust_unverified: bool = False, weight_format: str = "auto",
            trust: str = "sandbox", audit_floor: float = AUDIT_FLOOR) -> Installation:
    """Install kernelslot's built-ins (or ``bundle``'s candidates) into ``model``.

    ``bundle``: a loaded :class:`kernelslot.bundle.Bundle`, a bundle directory, or None (built-ins).
    ``slots``: which of :data:`SLOTS` to serve (each through its install point,
    install_points.py); a slot the model has no site for raises :class:`NoSiteError` saying why.
    ``store``: the result store holding verify
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
    plan = Plan(slots, CallContext(), candidates, verified, weight_format=weight_format)
    found = {}
    for slot, point in INSTALL_POINTS.items():  # find every site before changing anything
        if slot in slots:
            sites = point.find(model, plan)
            if isinstance(sites, str):
                raise NoSiteError(f"install: {type(model).__name__} has no site for {slot}: {sites}")
            found[slot] = sites
            if slot == "moe.block_tkg":  # what the block takes, the points after it skip
                plan.claimed.update(x for n, *_ in sites for x in (f"{n}.mlp", f"{n}.post_attention_layernorm"))
    executor = None
    if candidates:
        plan.serving = {"audits": True, "audit_floor": audit_floor}
        if trust == "sandbox":
            from kernelslot.isolation.executor import Executor

            executor = plan.serving["executor"] = Executor()
        else:
            log.warning("kernelslot: bundle %s runs in this process (trust='in-process'): it can rewrite the router, "
                        "its audits and the receipts, so neither its verify receipt nor the audits hold", bundle_hash[:12])
    placed: dict[str, Placed] = {}
    handle = Installation(model, slots, placed, plan.context, bundle_hash, executor=executor)
    try:
        for slot, point in INSTALL_POINTS.items():
            if slot in found:
                placed[slot] = point.place(model, found[slot], plan)
    except BaseException:
        handle.uninstall()
        raise
    handle._hooks.append(model.register_forward_pre_hook(_phase_hook(plan.context), with_kwargs=True))
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
