"""The verified envelope: a pass covers only the sizes that ran.

For every numeric routing field of the :class:`CallDescriptor` that a slot's profiles set (token
counts, kv lengths, top-k, head counts, world size, ...), the envelope is the range of values
verified. Where the slot can generate a field's value itself (``SlotDef.sizes`` maps the field to
the profile dimension that sets it), the referee adds **boundary profiles** at the candidate's
domain limits: its minimum, its maximum (twice the largest profiled value when the domain sets
none), and one value between, built from the profile nearest each target. A boundary too large to
run here (its inputs over ``envelope_max_bytes``, estimated linearly from the nearest profile) is
clipped to the largest value that fits. A boundary run that fails fails the slot; the receipt
records the verified envelope (``SlotReport.envelope``), and ``dispatch`` routes a variant only
inside declared domain ∩ verified envelope (:func:`envelope_domain`).

Kept apart from the manifest's effective domain (bundle/): this module only widens what is
verified and says where verification stopped.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from kernelslot.abi.capability import CallDescriptor, CapabilityDomain, Predicate
from kernelslot.slots.base import Candidate, Case, Profile, SlotDef

# Descriptor fields that are sizes (a range is meaningful); the others are labels.
SIZE_FIELDS = ("num_tokens", "batch_size", "kv_len", "top_k", "block_size", "num_q_heads", "num_kv_heads", "head_dim",
               "hidden_size", "intermediate_size", "num_experts", "world_size")


def declared_bounds(domain: CapabilityDomain, field: str) -> tuple[float, float]:
    """The smallest and largest value of ``field`` that ``domain`` admits (``1``/``inf`` where open)."""
    lo, hi = 1.0, math.inf
    for p in domain.predicates:
        if p.field != field:
            continue
        values = p.value if p.kind == "range" else (p.value,) if p.kind == "exact" else p.value
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums:
            lo, hi = max(lo, min(nums)), min(hi, max(nums))
    return lo, hi


def case_bytes(case: Case) -> int:
    """Bytes of every tensor a case holds (inputs, prepare arguments, outputs)."""
    total = 0

    def walk(obj: Any) -> None:
        nonlocal total
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, (list, tuple)):
            for o in obj:
                walk(o)
        elif isinstance(obj, dict):
            for o in obj.values():
                walk(o)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for f in dataclasses.fields(obj):
                walk(getattr(obj, f.name))

    walk((case.inputs, case.prepare_args))
    for spec in case.outputs.values():
        if spec is not None:
            total += math.prod(spec.shape) * torch.empty((), dtype=spec.dtype).element_size()
    return total


@dataclasses.dataclass
class Boundary:
    """One boundary profile to run, and why."""

    profile: Profile
    field: str
    value: int


def boundary_profiles(defn: SlotDef, cand: Candidate, ran: list[tuple[Profile, CallDescriptor]], max_bytes: int,
                      make_case: Any, clipped: dict[str, str]) -> list[Boundary]:
    """Profiles at ``cand``'s domain boundaries for every field ``defn.sizes`` can set.

    ``ran``: (profile, descriptor) of the profiles that ran on ``cand``; ``make_case(profile)``
    builds a case (for the memory estimate). Fields clipped for memory are explained in ``clipped``.
    """
    out: list[Boundary] = []
    for field, key in defn.sizes:
        seen = [(p, d.get(field)) for p, d in ran if isinstance(d.get(field), int) and isinstance(p.dims.get(key), int)]
        if not seen:
            continue
        values = sorted({v for _, v in seen})
        lo, hi = declared_bounds(cand.domain, field)
        top = hi if math.isfinite(hi) else 2 * values[-1]
        targets = {int(lo)} if lo < values[0] else set()
        if top > values[-1]:
            targets |= {int(top), int(round(math.sqrt(values[-1] * top)))}
        for target in sorted(t for t in targets if t not in values):
            base, base_v = min(seen, key=lambda pv: abs(math.log(pv[1]) - math.log(target)))
            probe = dataclasses.replace(base, name=f"{base.name}@{field}={target}", dims={**base.dims, key: target})
            if target > base_v:
                fits = int(base_v * max_bytes / max(1, case_bytes(make_case(base))))
                if fits < target:
                    clipped[field] = f"domain admits {field} up to {hi:g}; verified only to {max(fits, values[-1])} (memory)"
                    if fits <= values[-1]:
                        continue
                    target = fits
                    probe = dataclasses.replace(probe, name=f"{base.name}@{field}={target}", dims={**base.dims, key: target})
            out.append(Boundary(probe, field, target))
    return out


def verified_envelope(descs: list[CallDescriptor]) -> dict[str, list[int]]:
    """``{field: [lo, hi]}`` over the size fields the passing runs' descriptors set."""
    env: dict[str, list[int]] = {}
    for field in SIZE_FIELDS:
        vals = [d.get(field) for d in descs if isinstance(d.get(field), int)]
        if vals:
            env[field] = [min(vals), max(vals)]
    return env


def envelope_domain(envelope: dict[str, list[int]]) -> CapabilityDomain:
    """The verified envelope as a capability domain (one range predicate per field)."""
    return CapabilityDomain(tuple(Predicate(f, "range", (lo, hi)) for f, (lo, hi) in sorted(envelope.items())))
