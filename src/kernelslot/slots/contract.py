"""A slot's full contract, derived from the catalog (``kernelslot slots NAME`` and docs/slots/).

Everything here is read from the slot definitions themselves, so it cannot drift from what the
referee checks: the argument order and roles come from the :class:`Slot`; each argument's
dtype, shape and layout from the cases every diagnostic profile builds (a shape is written
symbolically when one expression of the profile's dimensions fits every profile); the prepare
forms and the fields of any view object from the prepare arguments; the semantics from the
family module's docstring; the comparators, profiles and model profiles from the
:class:`SlotDef`; and the :class:`CallDescriptor` values a domain can meet from ``describe``
applied to every profile (plus the fields the referee sets itself: ``arch``, ``dtype``,
``model``).
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import textwrap
from typing import Any

import torch

from kernelslot.abi import Role, SlotKind
from kernelslot.abi.capability import DESCRIPTOR_FIELDS
from kernelslot.slots.base import Profile, SlotDef, comparator_text, dtype_name
from kernelslot.slots.models import MODELS

_REFEREE_SET = {"arch": ["cpu", "sm_XY (CUDA: the device's compute capability)"]}

PREPARED_STATE = (
    "prepare() may derive anything from the values of the weights it is given (repacked, transposed or quantised "
    "copies, lookup tables) and keep it in the object it returns; `entry` reads that object and its own arguments. "
    "The referee reloads the weights in place (the same storages, shapes and data pointers, new values, as an engine "
    "does on a weight update) and calls prepare() again: the object it then returns must reflect the new values. "
    "So nothing may be keyed on a weight's address, shape or object identity (a layout cache, a registry of "
    "prepared layers), and nothing derived from one call's inputs may persist to another call.")
NO_PREPARED_STATE = (
    "No prepare(): nothing derived from one call's inputs may persist to another call (the referee refills the "
    "same storages with new values, so a result cached by address, shape or fingerprint is stale).")


def _case(defn: SlotDef, profile: Profile):
    return defn.make_case(profile, torch.Generator().manual_seed(0))


def _scalar_dims(profile: Profile) -> dict[str, int]:
    return {k: v for k, v in profile.dims.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}


_EXPRS = (("{}", 1.0), ("2{}", 2.0), ("{}/2", 0.5), ("{}/16", 1 / 16), ("{}/32", 1 / 32))


def _symbolic(shapes: list[tuple[tuple[int, ...], dict[str, int]]], packed: bool) -> str | None:
    """One expression per axis (a dimension name, else 2·name; for ``packed`` quantised tensors
    also name/2, name/16, name/32) that fits every profile's concrete shape. None — the caller
    then lists concrete shapes — when the profiles show fewer than two distinct shapes (no
    evidence), when an axis has no such expression, or when two of the preferred kind both fit."""
    if len({s for s, _ in shapes}) < 2 or len({len(s) for s, _ in shapes}) != 1:
        return None
    axes = []
    for axis in range(len(shapes[0][0])):
        for pattern, factor in _EXPRS if packed else _EXPRS[:2]:
            fits = None
            for shape, dims in shapes:
                here = {pattern.format(n) for n, v in dims.items() if v * factor == shape[axis]}
                fits = here if fits is None else fits & here
            if fits:
                break
        if not fits or len(fits) > 1:
            return None
        axes.append(next(iter(fits)))
    return "(" + ", ".join(axes) + (",)" if len(axes) == 1 else ")")


def _shape_text(shapes: list[tuple[tuple[int, ...], dict[str, int]]], dtype: torch.dtype | str | None = None) -> str:
    name = dtype_name(dtype) if isinstance(dtype, torch.dtype) else str(dtype)
    sym = _symbolic(shapes, packed=name in ("uint8", "int8") or name.startswith("float8"))
    if sym is not None:
        return sym
    distinct = sorted({s for s, _ in shapes}, key=lambda s: (len(s), s))
    text = ", ".join(str(tuple(s)) for s in distinct[:4])
    return text + (f", … ({len(distinct)} shapes)" if len(distinct) > 4 else "")


def _dtype_text(dtypes: set[str], profile_dtypes: set[str]) -> str:
    if dtypes == profile_dtypes and len(dtypes) > 1:
        return "the profile's dtype (" + ", ".join(sorted(dtypes)) + ")"
    return ", ".join(sorted(dtypes))


def _leaves(prefix: str, v: Any, out: dict[str, list[Any]]) -> None:
    """Flatten a prepare argument: dataclass fields recursively, by dotted path (order kept)."""
    out.setdefault(prefix, []).append(v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        for f in dataclasses.fields(v):
            _leaves(f"{prefix}.{f.name}", getattr(v, f.name), out)


def _variants(values: list[tuple[Any, dict[str, int]]]) -> list[str]:
    """What one field holds over the profiles: tensors by dtype with their shape, else values/types."""
    by_dtype: dict[str, list] = {}
    others: list[str] = []
    for v, dims in values:
        if isinstance(v, torch.Tensor):
            by_dtype.setdefault(dtype_name(v.dtype), []).append((tuple(v.shape), dims))
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            others.append(type(v).__name__)
        elif v is None or isinstance(v, (bool, int, float, str, tuple)) or isinstance(v, enum.Enum):
            others.append("None" if v is None else f"{type(v).__name__} {v.name if isinstance(v, enum.Enum) else v!r}")
        else:
            others.append(type(v).__name__)
    out = [f"{dt} {_shape_text(shapes, dt)}" for dt, shapes in by_dtype.items()]
    distinct = list(dict.fromkeys(others))
    return out + distinct[:6] + (["…"] if len(distinct) > 6 else [])


def _arguments(defn: SlotDef, cases: list[tuple[Profile, Any]]) -> list[dict[str, Any]]:
    profile_dtypes = {dtype_name(p.dtype) for p, _ in cases}
    out = []
    for i, a in enumerate(defn.slot.args):
        row: dict[str, Any] = {"position": i, "name": a.name, "role": a.role.value, "optional": a.optional}
        if a.doc:
            row["doc"] = a.doc
        if a.role in (Role.INPUT, Role.SCALAR):
            vals = [(c.inputs.get(a.name), p) for p, c in cases]
            tensors = [(v, p) for v, p in vals if isinstance(v, torch.Tensor)]
            if tensors:
                row["dtype"] = _dtype_text({dtype_name(v.dtype) for v, _ in tensors}, profile_dtypes)
                row["shape"] = a.shape or _shape_text([(tuple(v.shape), _scalar_dims(p)) for v, p in tensors])
                strided = sorted({p.name for v, p in tensors if not v.is_contiguous()})
                row["layout"] = "contiguous" if not strided else f"non-contiguous in {', '.join(strided)}"
                row["live"] = all(a.name in c.live_names() for _, c in cases)
            scalars = sorted({repr(v) for v, _ in vals if v is not None and not isinstance(v, torch.Tensor)})
            if scalars:
                row["values"] = scalars[:8] + (["…"] if len(scalars) > 8 else [])
            if any(v is None for v, _ in vals):
                row["none_in"] = sorted({p.name for v, p in vals if v is None})
        elif a.role is Role.OUTPUT:
            specs = [(c.outputs.get(a.name), p) for p, c in cases]
            given = [(s, p) for s, p in specs if s is not None]
            if given:
                row["dtype"] = _dtype_text({dtype_name(s.dtype) for s, _ in given}, profile_dtypes)
                row["shape"] = a.shape or _shape_text([(s.shape, _scalar_dims(p)) for s, p in given])
                policies = sorted({s.policy for s, _ in given})
                row["layout"] = " / ".join(
                    "strided: every dim but the first padded, non-zero storage offset; write through the given strides"
                    if pol == "padded" else "contiguous at a non-zero storage offset" for pol in policies)
                row["layout"] += "; also called once with a plain contiguous tensor, as an engine passes"
            if any(s is None for s, _ in specs):
                row["none_in"] = sorted({p.name for s, p in specs if s is None})
        elif a.role is Role.PREPARED:
            row["doc"] = a.doc or "the object your prepare() returned (opaque to the referee)"
        elif a.role is Role.GROUP:
            row["doc"] = a.doc or "the torch.distributed process group to communicate over (never the default group)"
        out.append(row)
    return out


def _prepare_forms(defn: SlotDef, cases: list[tuple[Profile, Any]]) -> list[dict[str, Any]]:
    """Each prepare form with every argument and view field as seen over all its profiles."""
    if not defn.slot.needs_prepare:
        return []
    forms: dict[str, dict[str, Any]] = {}
    seen: dict[str, dict[str, list]] = {}
    for p, c in cases:
        args = c.prepare_args
        tagged = bool(args) and isinstance(args[0], str)
        names = defn.slot.prepare_args
        if tagged and names[0] != "kind":
            names = ("kind", "view")  # the tagged form: a kind string and a view object
        form = (f'prepare("{args[0]}", ' + ", ".join(names[1:]) + ")" if tagged
                else "prepare(" + ", ".join(names) + ")")
        leaves: dict[str, list[Any]] = {}
        for k, v in zip(names, args):
            _leaves(k, v, leaves)
        for path, vals in leaves.items():
            seen.setdefault(form, {}).setdefault(path, []).extend((v, _scalar_dims(p)) for v in vals)
        if form not in forms:
            docs = {}
            for v in args:  # a view's conventions: its class's doc, or its module's where that holds them
                if dataclasses.is_dataclass(v) and not isinstance(v, type):
                    own = type(v).__module__ == defn.make_case.__module__
                    doc = inspect.getdoc(type(v) if own else sys.modules.get(type(v).__module__))
                    docs[type(v).__name__] = textwrap.dedent(doc or "").strip()
            forms[form] = {"form": form, "profiles": [], "conventions": docs}
        if p.name not in forms[form]["profiles"]:
            forms[form]["profiles"].append(p.name)
    for form, paths in seen.items():
        forms[form]["fields"] = [{"path": path, "holds": _variants(vals)} for path, vals in paths.items()]
    return list(forms.values())


def _activation_text(act: Any) -> str:
    g, u = "g", "u"
    parts = []
    lo, hi = act.gate_clamp
    if lo is not None or hi is not None:
        parts.append(f"g' = clamp(g, {lo}, {hi})")
        g = "g'"
    lo, hi = act.up_clamp
    if lo is not None or hi is not None:
        parts.append(f"u' = clamp(u, {lo}, {hi})")
        u = "u'"
    inner = f"{g}·σ({act.alpha:g}·{g})" if act.kind in ("silu", "swish", "swigluoai") else f"{act.kind}({g})"
    up = f"({u} + {act.up_bias:g})" if act.up_bias else u
    return "; ".join(parts + [f"act = {inner}·{up}"])


def _models(defn: SlotDef) -> list[dict[str, Any]]:
    out = []
    for name in sorted({p.model for p in defn.profiles}):
        m = MODELS[name]
        act = m.activation
        out.append({
            "model": name, "profiles": sorted({p.name for p in defn.profiles if p.model == name}),
            "router": m.router, "norm_topk_prob": m.norm_topk_prob, "routed_scaling_factor": m.routed_scaling_factor,
            "gemma_norm": m.gemma_norm, "shared_expert": m.shared_expert, "correction_bias": m.correction_bias,
            "expert_format": m.expert_format,
            "activation": {"kind": act.kind, "alpha": act.alpha, "up_bias": act.up_bias,
                           "gate_clamp": list(act.gate_clamp), "up_clamp": list(act.up_clamp),
                           "formula": _activation_text(act)},
        })
    return out


def _descriptor(defn: SlotDef, cases: list[tuple[Profile, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, list[Any]] = {}
    for p, c in cases:
        d = dataclasses.replace(defn.describe(c), dtype=dtype_name(p.dtype), model=p.model)
        for f in DESCRIPTOR_FIELDS:
            v = d.get(f)
            if v is not None:
                seen.setdefault(f, []).append(v)
    rows = []
    for f in DESCRIPTOR_FIELDS:
        vals = seen.get(f)
        if f in _REFEREE_SET:
            rows.append({"field": f, "values": _REFEREE_SET[f], "set_by": "referee"})
        elif vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            rows.append({"field": f, "range": [min(vals), max(vals)], "set_by": "slot"})
        elif vals:
            rows.append({"field": f, "values": sorted({str(v) for v in vals}),
                         "set_by": "referee" if f in ("dtype", "model") else "slot"})
    return rows


def _comparator_text(c: Any) -> str:
    return comparator_text(c) if c is not None else "the slot's comparator"


def _prepared_state(defn: SlotDef) -> str:
    if not defn.slot.needs_prepare:
        return NO_PREPARED_STATE
    text = PREPARED_STATE + (" " + defn.prepared_state if defn.prepared_state else "")
    if defn.slot.kind is SlotKind.COLLECTIVE:
        text += " (The collective referee does not reload the weights yet; the contract is the same.)"
    return text


_CACHE: dict[str, tuple[SlotDef, dict[str, Any]]] = {}


def slot_contract(defn: SlotDef) -> dict[str, Any]:
    """The full contract of one slot as plain JSON-able data (see module docstring); built once
    per process (every profile's case is made), so treat the result as read-only."""
    hit = _CACHE.get(defn.name)
    if hit is None or hit[0] is not defn:
        hit = _CACHE[defn.name] = (defn, _build_contract(defn))
    return hit[1]


def _build_contract(defn: SlotDef) -> dict[str, Any]:
    cases = [(p, _case(defn, p)) for p in defn.profiles]
    module = sys.modules.get(defn.make_case.__module__)
    profiles = []
    for p, c in cases:
        shapes = {k: list(v.shape) for k, v in c.inputs.items() if isinstance(v, torch.Tensor)}
        shapes.update({k: list(s.shape) for k, s in c.outputs.items() if s is not None})
        profiles.append({"name": p.name, "dtype": dtype_name(p.dtype), "model": p.model,
                         "dims": {k: (v if isinstance(v, (int, float, str, bool)) else repr(v)) for k, v in p.dims.items()},
                         "tags": sorted(p.tags), "comparator": _comparator_text(p.comparator), "shapes": shapes})
    return {
        "slot": defn.name, "family": defn.slot.family, "kind": defn.slot.kind.value, "summary": defn.slot.summary,
        "signature": defn.slot.signature(), "semantics": textwrap.dedent(inspect.getdoc(module) or "").strip(),
        "notes": defn.notes,
        "arguments": _arguments(defn, cases),
        "prepare": _prepare_forms(defn, cases),
        "prepared_state": _prepared_state(defn),
        "relations": [r.describe() for r in defn.relations],
        "comparator": defn.describe_comparator(),
        "profile_comparators": sorted({_comparator_text(p.comparator) for p in defn.profiles if p.comparator}),
        "incumbent": defn.incumbent.name,
        "builtins": [{"kernel": c.kernel.name, "domain": c.domain.describe()} for c in defn.builtin_candidates()],
        "models": _models(defn),
        "profiles": profiles,
        "descriptor": _descriptor(defn, cases),
        "domain_note": ("A domain is a conjunction of exact / one_of / range predicates over these fields; a field "
                        "the call does not set never matches. Fields not listed are never set for this slot."),
        "dtypes": sorted({dtype_name(p.dtype) for p in defn.profiles}),
    }


def catalog_summary() -> list[dict[str, Any]]:
    from kernelslot.slots import CATALOG

    rows = []
    for name in sorted(CATALOG):
        d = CATALOG[name]
        rows.append({"slot": name, "kind": d.slot.kind.value, "signature": d.slot.signature(),
                     "comparator": d.describe_comparator(), "profiles": len(d.profiles),
                     "dtypes": [dtype_name(t) for t in d.dtypes], "models": sorted({p.model for p in d.profiles}),
                     "summary": d.slot.summary})
    return rows


# --- text (Markdown; the same text is the docs page) ---------------------------------------------

def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows])


def render_contract(c: dict[str, Any], heading: str = "#", semantics_shown_for: str | None = None) -> str:
    """Markdown text of a contract; ``semantics_shown_for`` names a slot above on the same page
    whose (identical) semantics text is referred to instead of repeated."""
    h2 = heading + "#"
    lines = [f"{heading} `{c['slot']}` ({c['kind']})", "", c["summary"], "", "```", c["signature"], "```", ""]
    lines += [f"{h2} Arguments (in call order)", ""]
    rows = []
    for a in c["arguments"]:
        notes = []
        if a.get("optional"):
            notes.append("may be None" + (f" (in {', '.join(a['none_in'])})" if a.get("none_in") else ""))
        if a.get("values"):
            notes.append("values seen: " + ", ".join(a["values"]))
        if a.get("doc"):
            notes.append(a["doc"])
        if a.get("live") is False:
            notes.append("not refreshed on replay")
        rows.append([str(a["position"]), f"`{a['name']}`", a["role"], a.get("shape", ""), a.get("dtype", ""),
                     a.get("layout", ""), "; ".join(notes)])
    lines += _table(["#", "name", "role", "shape", "dtype", "layout", "notes"], rows) + [""]
    lines += ["Inputs must stay bit-exactly unchanged; every output cell must be written; `entry` returns None "
              "and never rebinds, aliases or keeps a reference to an argument. The same inputs must give bitwise the "
              "same outputs, whatever the freed memory holds, and process-wide numeric state (flush-to-zero, thread "
              "counts, default dtype, matmul precision, grad mode) must be left as found (the single-device referee "
              "repeats a call on poisoned scratch and compares that state around every call).", ""]
    for form in c["prepare"]:
        lines += [f"{h2} `{form['form']}`", "", f"Used by profiles: {', '.join(form['profiles'])}.", ""]
        rows = [[f"`{f['path']}`", " or ".join(f["holds"])] for f in form["fields"]]
        lines += _table(["argument / field", "holds (over those profiles: dtype and shape, or value)"], rows) + [""]
        for cls, doc in form["conventions"].items():
            quoted = "\n".join(("> " + ln).rstrip() for ln in doc.splitlines())
            lines += [f"Conventions of `{cls}`:", "", quoted, ""]
    lines += [f"{h2} Prepared state (what may persist across calls)", "", c["prepared_state"], ""]
    lines += [f"{h2} Metamorphic relations", ""]
    lines += ([f"- {r}" for r in c["relations"]] + ["", "Each is checked once per profile run, on the inputs of a call the "
               "candidate just made, within the comparator below."] if c["relations"] else ["None declared."]) + [""]
    lines += [f"{h2} Semantics", "", f"As for `{semantics_shown_for}` above (one module defines both)."
              if semantics_shown_for else c["semantics"], ""]
    if c["notes"]:
        lines += [c["notes"], ""]
    lines += [f"{h2} Comparator", "", f"Default: {c['comparator']}."]
    for pc in c["profile_comparators"]:
        lines.append(f"Profile override: {pc} (see the profile table).")
    lines += ["Default elementwise tolerances by output dtype: float32 1e-5, float16 1e-2, bfloat16 2e-2 "
              "(atol = rtol); ties are judged against admissible sets (no don't-care cells).", ""]
    lines += [f"{h2} Model profiles", ""]
    rows = [[m["model"], m["router"], str(m["norm_topk_prob"]), f"{m['routed_scaling_factor']:g}", m["activation"]["formula"],
             str(m["gemma_norm"]), str(m["shared_expert"]), m["expert_format"], ", ".join(m["profiles"])]
            for m in c["models"]]
    lines += _table(["model", "router", "norm_topk_prob", "routed scale", "expert activation (g = gate, u = up)",
                     "gemma norm", "shared expert", "expert format", "profiles"], rows) + [""]
    lines += [f"Built-in kernels: " + "; ".join(f"{b['kernel']} for {b['domain']}" for b in c["builtins"]) + ".", ""]
    lines += [f"{h2} Diagnostic profiles", ""]
    rows: dict[str, list[str]] = {}
    for p in c["profiles"]:  # one row per profile name; its dtypes joined
        if p["name"] in rows:
            rows[p["name"]][1] += f", {p['dtype']}"
            continue
        rows[p["name"]] = [p["name"], p["dtype"], p["model"], ", ".join(f"{k}={v}" for k, v in p["dims"].items()),
                           "; ".join(f"{k} {tuple(s)}" for k, s in p["shapes"].items()), ", ".join(p["tags"]),
                           p["comparator"]]
    lines += _table(["profile", "dtypes", "model", "dims", "shapes", "tags", "comparator"], list(rows.values())) + [""]
    lines += [f"{h2} CallDescriptor fields a domain may use", "", c["domain_note"], ""]
    rows = [[f"`{d['field']}`", f"{d['range'][0]} … {d['range'][1]}" if "range" in d else ", ".join(d["values"]),
             d["set_by"]] for d in c["descriptor"]]
    lines += _table(["field", "values in the diagnostic profiles", "set by"], rows) + [""]
    return "\n".join(lines)


def family_page(family: str) -> str:
    """docs/slots/<family>.md: every slot of the family, generated (checked by a test)."""
    from kernelslot.slots import CATALOG

    names = sorted(n for n, d in CATALOG.items() if d.slot.family == family)
    head = [f"# Slot family `{family}`", "",
            "Generated from the catalog by `kernelslot slots --docs docs/slots`; do not edit by hand "
            "(a test fails when this page and the catalog differ). The same text is printed by "
            "`kernelslot slots NAME`.", ""]
    parts, shown = [], {}
    for n in names:
        c = slot_contract(CATALOG[n])
        parts.append(render_contract(c, "##", shown.get(c["semantics"])))
        shown.setdefault(c["semantics"], n)
    return "\n".join(head + parts).rstrip() + "\n"


def families() -> list[str]:
    from kernelslot.slots import CATALOG

    return sorted({d.slot.family for d in CATALOG.values()})
