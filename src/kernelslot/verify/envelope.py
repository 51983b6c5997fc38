"""The verified envelope: a pass covers only the sizes that ran.

For every numeric routing field of the :class:`CallDescriptor` that a slot's profiles set (token
counts, kv lengths, top-k, head counts, world size, ...), the envelope is the range of values
verified. Where the slot can generate a field's value itself (``SlotDef.sizes`` maps the field to
the profile dimension that sets it), the referee adds **boundary profiles** at the candidate's
domain limits: its minimum, its maximum (twice the largest profiled value when the domain sets
none), and one value between, each built from the profile nearest it (a size entry's ``fit`` keeps the case valid: GQA groups, block multiples, ...). A boundary too
large to run here (its inputs over ``envelope_max_bytes``, estimated linearly from its base) is
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
                      make_case: Any, clipped: dict[str, str], fields: tuple[str, ...] | None = None) -> list[Boundary]:
    """Profiles at ``cand``'s domain boundaries for every field ``defn.sizes`` can set.

    ``ran``: (profile, descriptor) of the profiles that ran on ``cand``; ``make_case(profile)``
    builds a case (for the memory estimate, and to read the value a boundary reached). A size
    entry's ``fit(dims, target)`` (if any) builds the dims of a valid case near ``target`` (e.g.
    query heads a multiple of kv heads); without one the dimension is set to the target. A
    boundary is named by the value its case's descriptor reaches (a fit may move several
    dimensions, or land short of the target); one that reaches a value already verified, or
    reached by another boundary, is dropped. Fields clipped for memory are explained in
    ``clipped``; ``fields`` (None: all) limits which size fields are extended (the others stay
    as observed).
    """
    out: list[Boundary] = []
    memo: dict[str, int] = {}

    def size_of(p: Profile) -> int:
        if p.label not in memo:
            memo[p.label] = case_bytes(make_case(p))
        return memo[p.label]

    for size in defn.sizes:
        field, key = size[0], size[1]
        if fields is not None and field not in fields:
            continue
        fit = size[2] if len(size) > 2 else (lambda dims, v, key=key: {**dims, key: v} if isinstance(dims.get(key), int) else None)
        seen = [(p, d.get(field)) for p, d in ran if isinstance(d.get(field), int) and d.get(field) > 0]
        if not seen:
            continue
        values = sorted({v for _, v in seen})
        lo, hi = declared_bounds(cand.domain, field)
        top = hi if math.isfinite(hi) else 2 * values[-1]
        targets = {int(lo)} if lo < values[0] else set()
        if top > values[-1]:
            targets |= {int(top), int(round(math.sqrt(values[-1] * top)))}
        for target in sorted(t for t in targets if t not in values):
            # the profile nearest the target (its other dims are a realistic call), the smallest on a tie
            near = min(abs(math.log(v) - math.log(target)) for _, v in seen)
            base, base_v = min(((p, v) for p, v in seen if abs(math.log(v) - math.log(target)) == near),
                               key=lambda pv: size_of(pv[0]))
            if target > base_v:
                fits = int(base_v * max_bytes / max(1, size_of(base)))
                if fits < target:
                    clipped[field] = f"domain admits {field} up to {hi:g}; verified only to {max(fits, values[-1])} (memory)"
                    if fits <= values[-1]:
                        continue
                    target = fits
            dims = fit(dict(base.dims), target)
            if dims is None or dims == dict(base.dims) or any(b.field == field and b.profile.dims == dims for b in out):
                continue  # no valid case there, or the same case as another boundary (clipped to one size)
            profile = dataclasses.replace(base, dims=dims)
            value = defn.describe(make_case(profile)).get(field)  # the value the fit reached
            if value in values or any(b.field == field and b.value == value for b in out):
                continue  # the fit landed on a size that already ran, or will
            out.append(Boundary(dataclasses.replace(profile, name=f"{base.name}@{field}={value}"), field, value))
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
