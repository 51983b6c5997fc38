"""The effective domain of a bundle's op row: manifest and metadata, conjoined.

A row's **effective domain** is the conjunction of

- its ``[ops.domain]`` predicates (``{field = {exact | one_of | range = ...}}``);
- its dtypes: manifest ``dtypes`` ∩ metadata ``dtypes`` (whichever are given);
- its architectures: manifest ``architectures`` ∩ metadata ``arch`` / ``architectures``;
- the arena's metadata keys, with the arena's meaning: ``capabilities`` (``{field: value |
  [values] | {exact | one_of | min | max}}``, arena field names such as ``architecture``,
  ``hidden_dim``, ``tp_size`` mapped to descriptor fields), ``max_last_dim`` (the last
  dimension of the slot's first tensor input), ``min_num_tokens`` / ``max_num_tokens``,
  ``quant`` (expert-weight / tensor format);
- the **model** it is bound to: metadata ``model`` (or ``model_profile``; aliases such as
  ``MiniMax-M3-NVFP4`` resolve to the profile ``MiniMax-M3`` and add ``quant == nvfp4``), else
  the one model its ``[ops.domain]`` names, else ``generic``. The domain requires ``model == <bound model>``: a row is
  neither verified nor routed on another model's semantics.

``graph_safe`` is the manifest's or the metadata's (both given and different: an error).
Spellings are canonical (``abi.canonical_dtype`` / ``canonical_arch``). Anything
contradictory — an empty intersection, two different models, metadata naming another slot —
raises :class:`DomainError` naming both sides; other metadata keys (notes, provenance, the
arena's own correctness hints: comparators are never the bundle's) are ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kernelslot.abi import CapabilityDomain, CapabilityError, Predicate, canonical_arch, canonical_dtype, domains_overlap
from kernelslot.abi.capability import DESCRIPTOR_FIELDS, is_known_arch
from kernelslot.slots.models import MODELS, resolve_model

DTYPES = ("float32", "bfloat16", "float16")
# arena capability field -> kernelslot descriptor field
ARENA_FIELDS = {"architecture": "arch", "hidden_dim": "hidden_size", "intermediate_dim": "intermediate_size",
                "page_size": "block_size", "tp_size": "world_size", "dtype_name": "dtype"}
QUANT_ALIASES = {"none": "dense", "unquantized": "dense"}


class DomainError(ValueError):
    """A contradiction or a malformed value: ``key`` names where, the message says what."""

    def __init__(self, key: str, problem: str):
        super().__init__(problem)
        self.key = key


@dataclass(frozen=True)
class EffectiveDomain:
    """What a row may be verified on and routed to: one object for the referee, dispatch and scan."""

    domain: CapabilityDomain  # the full conjunction, model and arch included
    model: str  # the bound model profile
    dtypes: tuple[str, ...]  # () = unrestricted
    archs: tuple[str, ...]  # () = unrestricted
    graph_safe: bool



def _names(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise DomainError(key, f"must be a non-empty list of strings, got {value!r}")
    return tuple(value)


def dtype_names(value: Any, key: str) -> tuple[str, ...]:
    raw = _names(value, key)
    bad = [v for v in raw if canonical_dtype(v) not in DTYPES]
    if bad:
        raise DomainError(key, f"unknown dtype {bad[0]!r}; allowed: {', '.join(DTYPES)} (or bf16, fp16, half, fp32, float)")
    return tuple(dict.fromkeys(canonical_dtype(v) for v in raw))


def arch_names(value: Any, key: str) -> tuple[str, ...]:
    raw = _names(value, key)
    out = tuple(dict.fromkeys(canonical_arch(v) for v in raw))
    bad = [v for v in raw if not is_known_arch(canonical_arch(v))]
    if bad:
        raise DomainError(key, f"unknown architecture {bad[0]!r}; allowed: cpu or a CUDA architecture such as sm_80, sm90, sm_90a")
    return out


def _conjoin(manifest: tuple[str, ...], meta: tuple[str, ...], what: str, mkey: str, dkey: str) -> tuple[str, ...]:
    if not manifest or not meta:
        return manifest or meta
    both = tuple(v for v in manifest if v in meta)
    if not both:
        raise DomainError(mkey, f"manifest {what} {list(manifest)} and metadata {dkey} {list(meta)} have nothing in common")
    return both


def bind_model(meta: Mapping[str, Any], where: str) -> tuple[str | None, str | None]:
    """The model a row's metadata names (None if none) and the weight format its name implies."""
    named = {k: meta[k] for k in ("model", "model_profile") if meta.get(k) is not None}
    resolved = {}
    for key, name in named.items():
        r = resolve_model(name)
        if r is None:
            raise DomainError(f"{where}.{key}", f"model {name!r} is unknown; known: {', '.join(MODELS)} "
                                                f"(optionally with a weight-format suffix such as MiniMax-M3-NVFP4)")
        resolved[key] = r
    models = {r[0] for r in resolved.values()}
    if len(models) > 1:
        raise DomainError(f"{where}.model_profile", f"metadata model {named['model']!r} and model_profile "
                                                    f"{named['model_profile']!r} name different models")
    fmts = {r[1] for r in resolved.values() if r[1]}
    return (models.pop() if models else None), (fmts.pop() if len(fmts) == 1 else None)


def _capability(field: str, raw: Any, where: str) -> Predicate:
    key = f"{where}.capabilities.{field}"
    name = ARENA_FIELDS.get(field.strip().lower().replace("-", "_"), field.strip().lower().replace("-", "_"))
    if name not in DESCRIPTOR_FIELDS:
        raise DomainError(key, f"kernelslot's call descriptor has no field {field!r}, so the restriction could not be "
                               f"enforced; supported: {', '.join(DESCRIPTOR_FIELDS)}")
    if not isinstance(raw, dict):
        raw = {"one_of": raw} if isinstance(raw, list) else {"exact": raw}
    if set(raw) <= {"min", "max"} and raw:
        lo, hi = raw.get("min", 0), raw.get("max", float("inf"))
        spec: tuple[str, Any] = ("range", [lo, hi])
    elif len(raw) == 1 and set(raw) <= {"exact", "one_of"}:
        spec = next(iter(raw.items()))
    else:
        raise DomainError(key, f"needs a value, a list, {{exact = v}}, {{one_of = [...]}} or {{min, max}}; got {raw!r}")
    value = spec[1]
    if name == "model":
        value = [_model_value(v, key) for v in value] if isinstance(value, list) else _model_value(value, key)
    if name == "quant":
        value = [QUANT_ALIASES.get(v, v) for v in value] if isinstance(value, list) else QUANT_ALIASES.get(value, value)
    try:
        return Predicate(name, spec[0], value)
    except CapabilityError as exc:
        raise DomainError(key, str(exc)) from None


def _model_value(name: Any, key: str) -> str:
    r = resolve_model(name)
    if r is None:
        raise DomainError(key, f"model {name!r} is unknown; known: {', '.join(MODELS)}")
    return r[0]


def effective_domain(row: Mapping[str, Any], meta: Mapping[str, Any], slot: str, where: str,
                     override: bool = False) -> EffectiveDomain:
    """The effective domain of manifest row ``row`` (a parsed ``[[ops]]`` table) with metadata ``meta``.

    ``where`` prefixes keys in errors (``ops[0]``); metadata keys are named ``metadata.<key>``.
    For an ``override`` row the architectures describe its device entry only: what kernelslot
    composes is the torch form, run by the built-in base on any device, so they are reported
    (``archs``) but not part of the domain.
    """
    mwhere = f"{where}.metadata"
    for key in ("op", "slot"):
        if key in meta and meta[key] != slot:
            raise DomainError(f"{mwhere}.{key}", f"metadata names slot {meta[key]!r} but the manifest row is {slot!r}")
    dtypes = _conjoin(dtype_names(row["dtypes"], f"{where}.dtypes") if "dtypes" in row else (),
                      dtype_names(meta["dtypes"], f"{mwhere}.dtypes") if "dtypes" in meta else (),
                      "dtypes", f"{where}.dtypes", "dtypes")
    meta_archs: tuple[str, ...] = ()
    for key in ("arch", "architectures"):
        if key in meta:
            meta_archs = _conjoin(meta_archs, arch_names(meta[key], f"{mwhere}.{key}"), "architectures", f"{mwhere}.{key}", key)
    archs = _conjoin(arch_names(row["architectures"], f"{where}.architectures") if "architectures" in row else (),
                     meta_archs, "architectures", f"{where}.architectures", "arch/architectures")
    graph_safe = row.get("graph_safe")
    if "graph_safe" in meta:
        if not isinstance(meta["graph_safe"], bool):
            raise DomainError(f"{mwhere}.graph_safe", f"must be true or false, got {meta['graph_safe']!r}")
        if graph_safe is not None and graph_safe != meta["graph_safe"]:
            raise DomainError(f"{where}.graph_safe", f"manifest graph_safe = {str(graph_safe).lower()} but metadata "
                                                     f"graph_safe = {str(meta['graph_safe']).lower()}")
        graph_safe = meta["graph_safe"]
    model, fmt = bind_model(meta, mwhere)
    try:
        declared = CapabilityDomain.from_mapping(row.get("domain", {}))
    except CapabilityError as exc:
        raise DomainError(f"{where}.domain", str(exc)) from None
    if model is None:  # no model in metadata: the one [ops.domain] names, else generic
        named = _allowed(declared, "model")
        if len(named) > 1:
            raise DomainError(f"{where}.domain", f"a row is bound to one model, and its domain admits {list(named)}; "
                                                 f"make one variant per model or name the model in its metadata")
        model = named[0] if named else "generic"
    preds = list(declared.predicates) + [Predicate("model", "exact", model)]
    if dtypes:
        preds.append(Predicate("dtype", "one_of", dtypes))
    if archs and not override:
        preds.append(Predicate("arch", "one_of", archs))
    if fmt:
        preds.append(Predicate("quant", "exact", fmt))
    if "quant" in meta:
        quants = [QUANT_ALIASES.get(q.lower(), q.lower()) for q in _names(meta["quant"], f"{mwhere}.quant")]
        preds.append(Predicate("quant", "one_of", quants))
    for key, field, bound in (("max_last_dim", "last_dim", "max"), ("min_num_tokens", "num_tokens", "min"),
                              ("max_num_tokens", "num_tokens", "max")):
        if key in meta:
            v = meta[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise DomainError(f"{mwhere}.{key}", f"must be a non-negative integer, got {v!r}")
            preds.append(Predicate(field, "range", [0, v] if bound == "max" else [v, float("inf")]))
    caps = meta.get("capabilities", {})
    if not isinstance(caps, dict):
        raise DomainError(f"{mwhere}.capabilities", f"must be an object of {{field: predicate}}, got {caps!r}")
    preds.extend(_capability(f, raw, mwhere) for f, raw in caps.items())

    domain = CapabilityDomain(tuple(preds))
    if not domains_overlap(domain, domain):
        by_field: dict[str, list[str]] = {}
        for p in domain.predicates:
            by_field.setdefault(p.field, []).append(p.describe())
        clash = next(v for f, v in by_field.items() if not domains_overlap(
            CapabilityDomain(tuple(p for p in domain.predicates if p.field == f)), CapabilityDomain()))
        raise DomainError(where, f"the manifest and metadata contradict each other: {' and '.join(clash)} admit nothing")
    return EffectiveDomain(domain, model, dtypes, archs if override else _allowed(domain, "arch"), bool(graph_safe))


def _allowed(domain: CapabilityDomain, field: str) -> tuple[str, ...]:
    """The values ``domain``'s exact/one_of predicates on ``field`` admit together; () = unrestricted."""
    allowed: tuple[str, ...] | None = None
    for p in domain.predicates:
        if p.field == field and p.kind != "range":
            vals = (p.value,) if p.kind == "exact" else p.value
            allowed = vals if allowed is None else tuple(v for v in allowed if v in vals)
    return allowed or ()


def rebound(domain: CapabilityDomain, model: str) -> CapabilityDomain:
    """``domain`` with its model binding replaced by ``model`` (``verify --model`` overrides metadata)."""
    return CapabilityDomain(tuple(p for p in domain.predicates if p.field != "model") + (Predicate("model", "exact", model),))
