"""The verified envelope: a pass covers only the sizes that ran.

For every numeric routing field of the :class:`CallDescriptor` that a slot's profiles set (token
counts, kv lengths, top-k, head counts, world size, ...), the envelope records the sizes verified.
Where the slot can generate a field's value itself (``SlotDef.sizes`` maps the field to the
profile dimension that sets it), the referee adds **boundary profiles** at the candidate's domain
limits: its minimum, its maximum (twice the largest profiled value when the domain sets none), and
one value between, each built from the profile nearest it (a size entry's ``fit`` keeps the case
valid: GQA groups, block multiples, ...). Those move one field at a time, so for every pair of
extended fields one **corner profile** then runs both at once: the run that reached the first
field's maximum, with the second moved to its maximum. A boundary or corner too large to run here
(its inputs over ``envelope_max_bytes``, estimated linearly from its base) is clipped to the
largest value that fits. A boundary run that fails fails the slot.

The receipt records the envelope as what ran (``SlotReport.envelope``): a
:class:`~kernelslot.abi.Staircase`, the union of the boxes from the smallest value of every field
up to each passing run's sizes, so a combination no single run reached (two fields each verified
to its maximum, never both together) is outside it. ``dispatch`` routes a variant only inside
declared domain ∩ verified envelope (:func:`envelope_domain`).

Kept apart from the manifest's effective domain (bundle/): this module only widens what is
verified and says where verification stopped.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from kernelslot.abi.capability import CallDescriptor, CapabilityDomain, Staircase
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
    """One boundary profile to run, and why: ``field`` reaches ``value`` (and, for a corner
    profile, ``joint``'s field reaches its value in the same run)."""

    profile: Profile
    field: str
    value: int
    joint: tuple[str, int] | None = None


def _sizes(desc: CallDescriptor) -> dict[str, int]:
    return {f: desc.get(f) for f in SIZE_FIELDS if isinstance(desc.get(f), int)}


def _dominated(sizes: dict[str, int], by: dict[str, int]) -> bool:
    """Whether a run at ``by`` already covers ``sizes`` (at least as large in every field)."""
    return all(f in by and by[f] >= v for f, v in sizes.items())


def boundary_profiles(defn: SlotDef, cand: Candidate, ran: list[tuple[Profile, CallDescriptor]], max_bytes: int,
                      make_case: Any, clipped: dict[str, str], fields: tuple[str, ...] | None = None) -> list[Boundary]:
    """Profiles at ``cand``'s domain boundaries for every field ``defn.sizes`` can set, then one
    corner profile per pair of those fields.

    ``ran``: (profile, descriptor) of the profiles that ran on ``cand``; ``make_case(profile)``
    builds a case (for the memory estimate, and to read the value a boundary reached). A size
    entry's ``fit(dims, target)`` (if any) builds the dims of a valid case near ``target`` (e.g.
    query heads a multiple of kv heads); without one the dimension is set to the target. A
    boundary is named by the value its case's descriptor reaches (a fit may move several
    dimensions, or land short of the target); one that reaches a value already verified, or
    reached by another boundary, is dropped. Fields clipped for memory are explained in
    ``clipped``; ``fields`` (None: all) limits which size fields are extended (the others stay
    as observed). Corners: see :func:`_corners`.
    """
    out: list[Boundary] = []
    reached: list[tuple[Profile, CallDescriptor]] = []
    memo: dict[str, int] = {}

    def size_of(p: Profile) -> int:
        if p.label not in memo:
            memo[p.label] = case_bytes(make_case(p))
        return memo[p.label]

    extended = []
    for size in defn.sizes:
        field, key = size[0], size[1]
        if fields is not None and field not in fields:
            continue
        fit = size[2] if len(size) > 2 else (lambda dims, v, key=key: {**dims, key: v} if isinstance(dims.get(key), int) else None)
        seen = [(p, d.get(field)) for p, d in ran if isinstance(d.get(field), int) and d.get(field) > 0]
        if not seen:
            continue
        extended.append((field, fit))
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
            desc = defn.describe(make_case(profile))
            value = desc.get(field)  # the value the fit reached
            if value in values or any(b.field == field and b.value == value for b in out):
                continue  # the fit landed on a size that already ran, or will
            out.append(Boundary(dataclasses.replace(profile, name=f"{base.name}@{field}={value}"), field, value))
            reached.append((out[-1].profile, desc))
    return out + _corners(defn, extended, list(ran) + reached, max_bytes, make_case, size_of, clipped)


def _corners(defn: SlotDef, extended: list[tuple[str, Any]], runs: list[tuple[Profile, CallDescriptor]],
             max_bytes: int, make_case: Any, size_of: Any, clipped: dict[str, str]) -> list[Boundary]:
    """One profile per pair (f, g) of extended fields (``defn.sizes`` order) at both maxima.

    It grows from the run that reached f's largest value (the one with the largest g among them),
    with g moved to the largest value any run reached (clipped for memory like a boundary). A
    corner whose case a run already dominates (at least as large in every size field) is dropped,
    and so is one whose fit cannot move g there. What a corner reaches is read from its case: a fit
    may move f too (then the corner is named by both values it reached).
    """
    out: list[Boundary] = []
    done = [_sizes(d) for _, d in runs]
    for i, (f, _) in enumerate(extended):
        for g, fit in extended[i + 1:]:
            with_f = [(p, d) for p, d in runs if isinstance(d.get(f), int) and isinstance(d.get(g), int)]
            if not with_f:
                continue
            f_top = max(d.get(f) for _, d in with_f)
            g_top = max(d.get(g) for _, d in with_f)
            start, start_d = min(((p, d) for p, d in with_f if d.get(f) == f_top), key=lambda pd: (-pd[1].get(g), size_of(pd[0])))
            g_now, target = start_d.get(g), g_top
            if g_now >= g_top:
                continue  # some run already reached both maxima
            fits = int(g_now * max_bytes / max(1, size_of(start)))
            if fits < target:
                clipped[f"{f}+{g}"] = (f"{f} {f_top} and {g} {g_top} never ran together: the corner fits only "
                                       f"{g} {max(fits, g_now)} (memory)")
                if fits <= g_now:
                    continue
                target = fits
            dims = fit(dict(start.dims), target)
            if dims is None or dims == dict(start.dims):
                continue
            base = start.name.split("@")[0]
            profile = dataclasses.replace(start, dims=dims)
            desc = defn.describe(make_case(profile))
            sizes = _sizes(desc)
            if any(_dominated(sizes, d) for d in done):
                continue  # the fit landed where a run already covers it
            done.append(sizes)
            name = f"{base}@{f}={desc.get(f)},{g}={desc.get(g)}"
            out.append(Boundary(dataclasses.replace(profile, name=name), f, desc.get(f), (g, desc.get(g))))
    return out


def verified_envelope(descs: list[CallDescriptor]) -> dict[str, Any]:
    """The staircase of the passing runs' size fields, in its JSON form (:meth:`Staircase.to_json`):
    ``{field: [lo, hi], ..., "corners": [{field: value, ...}, ...]}``."""
    return Staircase.of_runs([_sizes(d) for d in descs], SIZE_FIELDS).to_json()


def envelope_domain(envelope: dict[str, Any]) -> Staircase:
    """A recorded verified envelope (this version's form, or an old receipt's ``{field: [lo, hi]}`` box)
    as the routing region ``dispatch`` checks a call against."""
    return Staircase.from_json(envelope)


def describe_envelope(envelope: dict[str, Any], shown: int = 3) -> str:
    """One line for a recorded envelope: each field's range, then the corners that ran (their count
    past ``shown``; the JSON report lists them all)."""
    st = envelope_domain(envelope)
    bounds = st.to_json()
    ranges = ", ".join(f"{f} {bounds[f][0]}..{bounds[f][1]}" for f in st.fields)
    if len(st.corners) <= 1 or len(st.fields) <= 1:
        return ranges
    if len(st.corners) > shown:
        return f"{ranges}; only below one of {len(st.corners)} runs' sizes (the corners in the JSON report)"
    corners = "; ".join(" ".join(f"{f}={v}" for f, v in zip(st.fields, c)) for c in st.corners)
    return f"{ranges}; only below a run that reached {corners}"
