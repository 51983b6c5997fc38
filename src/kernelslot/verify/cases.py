"""Profile runs and the cases they call with: selection, seeding, device copies, refills.

Shared by the single-device pipeline (``verify/single/``) and the collective referee
(``verify/collective/``). Conventions: ``make_case(defn, profile, seed, call)`` is deterministic
in its arguments, and shapes depend on the profile only, so draw ``call`` of a profile refills
the storages of draw 0 (``refill_live``). References run on :func:`clone_case` copies, never on
tensors a candidate has seen.
"""
from __future__ import annotations

import copy
import dataclasses
import zlib
from typing import Any, Callable

import torch

from kernelslot.abi import Arg, Role
from kernelslot.abi.capability import CallDescriptor
from kernelslot.slots.base import Candidate, Case, Profile, SlotDef, dtype_name
from kernelslot.verify.options import VerifyOptions, device_arch
from kernelslot.verify.plan import needs_fresh, refill_inputs
from kernelslot.verify.verdict import ProfileResult

__all__ = ["select_profiles", "profile_runs", "new_result", "case_seed", "make_case", "to_device", "tensors_in",
           "clone_case", "describe", "refill_live", "call_args", "route"]


def select_profiles(defn: SlotDef, opts: VerifyOptions, model: str | None) -> list[Profile]:
    """The slot's profiles for ``model``: its own, else the generic ones run with ``model``'s
    semantics (a slot without model-specific profiles judges every model alike)."""
    profiles = list(defn.profiles)
    if model is not None:
        own = [p for p in profiles if p.model == model]
        profiles = own or [dataclasses.replace(p, model=model) for p in profiles if p.model == "generic"]
    if opts.dtypes is not None:
        profiles = [p for p in profiles if p.dtype in opts.dtypes]
    if opts.profiles is not None:
        profiles = [p for p in profiles if p.name in opts.profiles]
    return profiles


def profile_runs(defn: SlotDef, profiles: list[Profile], opts: VerifyOptions) -> list[tuple[Profile, int]]:
    """(profile, seed) of every run: each selected profile at each seed, then ``opts.draws`` drawn
    profiles per seed around the selected ones (slots/draw.py; reproduced by the same seed). A
    profile-name filter runs exactly the named profiles."""
    runs = [(p, seed) for p in profiles for seed in opts.seeds]
    if opts.draws and opts.profiles is None and defn.draw is not None and profiles:
        from kernelslot.slots.draw import drawn_profiles  # Hypothesis: imported only when drawing

        runs += [(p, seed) for seed in opts.seeds for p in drawn_profiles(defn, profiles, seed, opts.draws)]
    return runs


def new_result(defn: SlotDef, profile: Profile, seed: int, kernel: str) -> ProfileResult:
    """An empty result for one profile run (a drawn profile's record included)."""
    res = ProfileResult(defn.name, profile.name, dtype_name(profile.dtype), profile.model, seed, kernel)
    res.drawn = dict(profile.drawn or {})
    return res


def case_seed(profile: Profile, seed: int, call: int) -> int:
    return (zlib.crc32(profile.label.encode()) + 1_000_003 * seed + 7919 * call) % (2**63)


def make_case(defn: SlotDef, profile: Profile, seed: int, call: int) -> Case:
    gen = torch.Generator().manual_seed(case_seed(profile, seed, call))
    return defn.make_case(profile, gen)


def to_device(obj: Any, device: torch.device) -> Any:
    """Copy the tensors inside ``obj`` (tuples, lists, dicts, dataclasses) to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, copy=True)  # never the referee's own CPU image, even on the CPU
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init})
    return obj


def tensors_in(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor reachable in ``obj``, by a dotted path (for bit-exact mutation checks)."""
    found: dict[str, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        found[prefix or "value"] = obj
    elif isinstance(obj, (list, tuple)):
        for i, o in enumerate(obj):
            found.update(tensors_in(o, f"{prefix}[{i}]"))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            found.update(tensors_in(v, f"{prefix}.{k}" if prefix else str(k)))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            found.update(tensors_in(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name))
    return found


def clone_case(case: Case) -> Case:
    """A deep copy for the reference: the reference never sees the candidate's tensors."""
    return Case(
        inputs={k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in case.inputs.items()},
        outputs=dict(case.outputs),
        prepare_args=copy.deepcopy(case.prepare_args),
        live=case.live,
        meta=copy.deepcopy(case.meta),
    )


def describe(defn: SlotDef, case: Case, profile: Profile, device: str) -> CallDescriptor:
    desc = defn.describe(case)
    first = next((case.inputs[a.name] for a in defn.slot.args if isinstance(case.inputs.get(a.name), torch.Tensor)), None)
    return dataclasses.replace(desc, arch=device_arch(device), dtype=dtype_name(profile.dtype), model=profile.model,
                               last_dim=first.shape[-1] if first is not None and first.dim() else None)


def refill_live(defn: SlotDef, profile: Profile, seed: int, call: int, case: Case, prev: Case, mode: str = "full",
                pick: int = 0) -> Case:
    """Refill the live inputs of ``case`` in place (same storage) and return the CPU case they now hold.

    ``mode`` is a refill kind of :mod:`kernelslot.verify.plan` (full, head, tail, row, cells);
    the fresh values are draw ``call`` of the profile and seed, ``pick`` places a sparse refill.
    """
    names = case.live_names()
    fresh = {n: v for n, v in make_case(defn, profile, seed, call).inputs.items() if n in names} if needs_fresh(mode) else None
    now = refill_inputs({n: prev.inputs[n] for n in names}, mode, pick, fresh)
    for name, value in now.items():
        case.inputs[name].copy_(value)
    return dataclasses.replace(prev, inputs={**prev.inputs, **now})


def call_args(defn: SlotDef, inputs: dict[str, Any], outputs: dict[str, Any], other: Callable[[Arg], Any]) -> list[Any]:
    """A call's arguments in the slot's order: inputs and scalars from ``inputs``, each output's
    padded view (``None`` for an output the case leaves out), ``other(arg)`` for the other roles."""
    values = []
    for a in defn.slot.args:
        if a.role in (Role.INPUT, Role.SCALAR):
            values.append(inputs[a.name])
        elif a.role is Role.OUTPUT:
            values.append(outputs[a.name].view if a.name in outputs else None)
        else:
            values.append(other(a))
    return values


def route(defn: SlotDef, cands: list[Candidate], profile: Profile, seed: int, device: str) -> tuple[Candidate | None, str]:
    """The variant whose domain covers ``profile``'s call, or None and why (the skipped reason)."""
    desc = describe(defn, make_case(defn, profile, seed, 0), profile, device)
    for cand in cands:
        if cand.domain.matches(desc):
            return cand, ""
    if len(cands) == 1:
        return None, "outside declared domain: " + ", ".join(cands[0].domain.mismatches(desc))
    return None, "outside every variant's domain (the incumbent runs)"
