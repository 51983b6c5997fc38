"""Call descriptors and capability domains (the routing contract).

A live call is described by a :class:`CallDescriptor`. A candidate declares a
:class:`CapabilityDomain`: a conjunction of predicates over descriptor fields, each one of

* ``exact``  — the field equals a value;
* ``one_of`` — the field is one of a list of values;
* ``range``  — ``lo <= field <= hi`` (inclusive, numbers only).

A field the descriptor lacks (``None``) is a **mismatch**, never a wildcard. Unknown field or
predicate names are rejected when the domain is built (i.e. when a bundle loads).

Spellings are canonical on both sides: ``dtype`` values and predicate values go through
:func:`canonical_dtype` (``bf16`` -> ``bfloat16``, ``half`` -> ``float16``, ...), ``arch``
values through :func:`canonical_arch` (``sm80``, ``sm_80``, ``SM-80`` -> ``sm_80``; the
``a``/``f`` compile-target suffixes of ``sm90a``/``sm100f`` name the same device, ``sm_90`` /
``sm_100``), in descriptors and in domains alike.

A :class:`Staircase` is the other kind of routing region: the sizes a verification actually ran
(``verify/envelope.py``), a union of boxes that share one lower corner.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping

PREDICATES = ("exact", "one_of", "range")


class CapabilityError(ValueError):
    """A capability domain or predicate is malformed."""


DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
_ARCH = re.compile(r"^sm_?(\d{2,3})[af]?$")


def canonical_dtype(name: Any) -> Any:
    """``bf16``/``fp16``/``half``/``fp32``/``float``/``torch.bfloat16`` -> the torch dtype name."""
    if not isinstance(name, str):
        return name
    token = name.strip().lower().removeprefix("torch.")
    return DTYPE_ALIASES.get(token, token)


def canonical_arch(name: Any) -> Any:
    """``sm80``/``sm_80``/``SM-80``/``sm80a`` -> ``sm_80``; other names lower-cased (``cpu``)."""
    if not isinstance(name, str):
        return name
    token = name.strip().lower().replace("-", "_")
    m = _ARCH.match(token)
    return f"sm_{m.group(1)}" if m else token


def is_known_arch(name: str) -> bool:
    """Whether ``name`` (canonical) is ``cpu`` or a CUDA ``sm_XY``."""
    return name == "cpu" or bool(_ARCH.match(name))


_CANONICAL = {"dtype": canonical_dtype, "arch": canonical_arch}


@dataclass(frozen=True)
class CallDescriptor:
    """What a live call looks like, as seen by the dispatcher. Missing facts are ``None``."""

    model: str | None = None
    phase: str | None = None  # "prefill" | "decode"
    dtype: str | None = None  # torch dtype name, e.g. "bfloat16"
    num_tokens: int | None = None
    batch_size: int | None = None
    kv_len: int | None = None
    top_k: int | None = None
    block_size: int | None = None
    num_q_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_experts: int | None = None
    layout: str | None = None
    quant: str | None = None  # "dense" | "fp8_row" | "mxfp4" | "mxfp8" | "nvfp4" | ...
    world_size: int | None = None
    arch: str | None = None  # "cpu" | "sm_90" | ... (canonical_arch)
    last_dim: int | None = None  # the last dimension of the slot's first tensor input

    def __post_init__(self) -> None:
        for name, canon in _CANONICAL.items():
            object.__setattr__(self, name, canon(getattr(self, name)))

    def get(self, name: str) -> Any:
        return getattr(self, name)


DESCRIPTOR_FIELDS = tuple(f.name for f in fields(CallDescriptor))


@dataclass(frozen=True)
class Predicate:
    field: str
    kind: str
    value: Any

    def __post_init__(self) -> None:
        if self.field not in DESCRIPTOR_FIELDS:
            raise CapabilityError(
                f"unknown descriptor field {self.field!r}; allowed: {', '.join(DESCRIPTOR_FIELDS)}"
            )
        if self.kind not in PREDICATES:
            raise CapabilityError(
                f"unknown predicate {self.kind!r} for field {self.field!r}; allowed: {', '.join(PREDICATES)}"
            )
        canon = _CANONICAL.get(self.field, lambda v: v)
        if self.kind == "one_of":
            if not isinstance(self.value, (list, tuple)) or not self.value:
                raise CapabilityError(f"{self.field}.one_of needs a non-empty list, got {self.value!r}")
            object.__setattr__(self, "value", tuple(canon(v) for v in self.value))
        if self.kind == "exact":
            object.__setattr__(self, "value", canon(self.value))
        if self.kind == "range":
            ok = (
                isinstance(self.value, (list, tuple))
                and len(self.value) == 2
                and all(_is_number(v) for v in self.value)
                and self.value[0] <= self.value[1]
            )
            if not ok:
                raise CapabilityError(f"{self.field}.range needs [lo, hi] numbers with lo <= hi, got {self.value!r}")
            object.__setattr__(self, "value", tuple(self.value))

    def matches(self, desc: CallDescriptor) -> bool:
        actual = desc.get(self.field)
        if actual is None:
            return False
        if self.kind == "exact":
            return actual == self.value
        if self.kind == "one_of":
            return actual in self.value
        lo, hi = self.value
        return _is_number(actual) and lo <= actual <= hi

    def describe(self) -> str:
        if self.kind == "exact":
            return f"{self.field} == {self.value!r}"
        if self.kind == "one_of":
            return f"{self.field} in {list(self.value)!r}"
        return f"{self.value[0]} <= {self.field} <= {self.value[1]}"


@dataclass(frozen=True)
class CapabilityDomain:
    """A conjunction of predicates; the empty domain accepts every call."""

    predicates: tuple[Predicate, ...] = ()

    @staticmethod
    def from_mapping(spec: Mapping[str, Mapping[str, Any]]) -> "CapabilityDomain":
        """Build from ``{field: {predicate: value}}`` (the manifest's ``[ops.domain]`` table)."""
        preds = []
        for field_name, body in spec.items():
            if not isinstance(body, Mapping) or len(body) != 1:
                raise CapabilityError(
                    f"domain field {field_name!r} needs exactly one predicate table like "
                    f"{{ exact = ... }}, {{ one_of = [...] }} or {{ range = [lo, hi] }}; got {body!r}"
                )
            (kind, value), = body.items()
            preds.append(Predicate(field_name, kind, value))
        return CapabilityDomain(tuple(preds))

    def matches(self, desc: CallDescriptor) -> bool:
        return all(p.matches(desc) for p in self.predicates)

    def mismatches(self, desc: CallDescriptor) -> list[str]:
        return [p.describe() for p in self.predicates if not p.matches(desc)]

    def describe(self) -> str:
        return " and ".join(p.describe() for p in self.predicates) or "any call"


CORNERS = "corners"  # the key of a staircase's corner list in its JSON form (never a descriptor field)


@dataclass(frozen=True)
class Staircase:
    """The union of the boxes ``[lo, corner]`` over ``corners``: what a verification ran.

    ``fields`` are numeric descriptor fields; ``lo`` / ``hi`` their smallest / largest value over
    the runs; each corner is one run's values (one per field, in ``fields`` order), and none is
    dominated by another. A descriptor lies inside iff every field holds a number within
    ``[lo, hi]`` and some corner is at least it in every field: a run at a size covers every
    smaller one, never a combination of fields that no single run reached (two fields each verified
    to its maximum, but never both at once, stay outside). A field the descriptor lacks is a
    mismatch, as in a :class:`CapabilityDomain`.

    JSON form (:meth:`to_json`): ``{field: [lo, hi], ..., "corners": [{field: value, ...}, ...]}``.
    Without ``"corners"`` (a box, as receipts recorded it before corners existed) the box's upper
    corner is the one corner: read back, an old receipt claims exactly what it said.
    """

    fields: tuple[str, ...]
    lo: tuple[int | float, ...]
    corners: tuple[tuple[int | float, ...], ...]

    @staticmethod
    def of_runs(runs: Iterable[Mapping[str, Any]], fields: Iterable[str]) -> "Staircase":
        """The staircase of the runs' values (each a mapping field -> number) over those of
        ``fields`` that some run sets; a run lacking one of them counts there at its lowest value."""
        runs = [dict(r) for r in runs]
        names = tuple(f for f in fields if any(_is_number(r.get(f)) for r in runs))
        lo = tuple(min(r[f] for r in runs if _is_number(r.get(f))) for f in names)
        points = {tuple(r[f] if _is_number(r.get(f)) else low for f, low in zip(names, lo)) for r in runs}
        return Staircase(names, lo, _maximal(points))

    @staticmethod
    def from_json(env: Mapping[str, Any]) -> "Staircase":
        """Read :meth:`to_json`'s form (or a plain ``{field: [lo, hi]}`` box); raise
        :class:`CapabilityError` on anything else."""
        bounds = {f: v for f, v in env.items() if f != CORNERS}
        for f, v in bounds.items():
            if f not in DESCRIPTOR_FIELDS or not (isinstance(v, (list, tuple)) and len(v) == 2
                                                  and all(_is_number(x) for x in v) and v[0] <= v[1]):
                raise CapabilityError(f"verified envelope: {f}: expected a descriptor field and [lo, hi], got {v!r}")
        names = tuple(bounds)
        raw = env.get(CORNERS, [{f: bounds[f][1] for f in names}])
        if not isinstance(raw, (list, tuple)) or not all(
                isinstance(c, Mapping) and set(c) == set(names) and all(_is_number(c[f]) for f in names) for c in raw):
            raise CapabilityError(f"verified envelope: {CORNERS} must be a list of {{field: value}} over {list(names)}, "
                                  f"got {raw!r}")
        corners = _maximal({tuple(c[f] for f in names) for c in raw})
        lo = tuple(bounds[f][0] for f in names)
        if any(not bounds[f][0] <= c[i] <= bounds[f][1] for c in corners for i, f in enumerate(names)):
            raise CapabilityError(f"verified envelope: a corner lies outside the bounds {dict(bounds)}")
        return Staircase(names, lo, corners)

    def to_json(self) -> dict[str, Any]:
        hi = [max(c[i] for c in self.corners) for i in range(len(self.fields))]
        out: dict[str, Any] = {f: [lo, h] for f, lo, h in zip(self.fields, self.lo, hi)}
        out[CORNERS] = [dict(zip(self.fields, c)) for c in self.corners]
        return out

    def matches(self, desc: CallDescriptor) -> bool:
        values = [desc.get(f) for f in self.fields]
        if not all(_is_number(v) and v >= lo for v, lo in zip(values, self.lo)):
            return False
        return any(all(v <= c for v, c in zip(values, corner)) for corner in self.corners)

    def describe(self) -> str:
        if not self.fields:
            return "any call"
        lows = ", ".join(f"{f} >= {lo}" for f, lo in zip(self.fields, self.lo))
        boxes = " | ".join("(" + ", ".join(f"{f} <= {v}" for f, v in zip(self.fields, c)) + ")" for c in self.corners)
        return f"{lows}, inside one of {boxes}"


def _maximal(points: set[tuple]) -> tuple[tuple, ...]:
    """The points no other point dominates (at least as large in every coordinate), sorted."""
    return tuple(sorted(p for p in points if not any(q != p and all(a <= b for a, b in zip(p, q)) for q in points)))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _field_admits(preds: list[Predicate]) -> bool:
    """Whether some value satisfies every predicate in ``preds`` (all on one field)."""
    values: set | None = None
    lo, hi = float("-inf"), float("inf")
    has_range = False
    for p in preds:
        if p.kind == "range":
            has_range = True
            lo, hi = max(lo, p.value[0]), min(hi, p.value[1])
        else:
            allowed = {p.value} if p.kind == "exact" else set(p.value)
            values = allowed if values is None else values & allowed
    if values is None:
        return lo <= hi
    if not has_range:
        return bool(values)
    return any(_is_number(v) and lo <= v <= hi for v in values)


def domains_overlap(a: CapabilityDomain, b: CapabilityDomain) -> bool:
    """True when some descriptor could match both domains."""
    by_field: dict[str, list[Predicate]] = {}
    for p in a.predicates + b.predicates:
        by_field.setdefault(p.field, []).append(p)
    return all(_field_admits(preds) for preds in by_field.values())
