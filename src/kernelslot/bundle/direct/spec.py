"""The direct-artifact form of an ``[[ops]]`` row, parsed into typed, joined, bounded objects.

A direct row names no Python source. It lists the native sources the referee builds
(``native_sources`` for ``native.elf.v1``, ``cuda_sources`` for ``cuda.cubin.v1``), the
referee-allocated storage (``[[ops.artifact_resources]]``) and ordered exports
(``[[ops.aot_exports]]``), each a closed launch program: typed ``bindings`` projecting the slot
call (their order is the index space of the plan), a ``device_plan`` with the kernel inventory
(logical names and the byte width of every formal parameter) and the launch sequence, optional
``specializes`` predicates and a ``prelaunch`` fill. See docs/direct-artifacts.md.

Everything is checked here, before anything is built: every key, every expression against
the vocabulary of :mod:`kernelslot.bundle.direct.expr`, every expression and parameter reference
joined back to a binding of the same export, every width against its kernel, every resource
against its lifetime. The same parse runs again on the declaration stored in the seal.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelslot.abi import Role, Slot
from kernelslot.bundle.direct.expr import Expr, ExprError, parse_expr

ROLES = ("init", "prepare", "reset", "run", "destroy")  # lifecycle order
KINDS = ("pointer", "scalar", "packed_struct", "tma_descriptor", "fast_divmod", "stream", "group_handle")
SCALAR_TYPES = {"i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8, "f32": 4, "f64": 8}
FIELD_TYPES = {**SCALAR_TYPES, "ptr": 8}
RESOURCE_DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32", "int64")
RESOURCE_PREFIXES = {"workspace": "call", "prepared": "prepared", "state": "engine"}
DIRECT_KEYS = ("aot_exports", "artifact_resources", "native_sources", "cuda_sources")
EXPORT_KEYS = ("provider", "name", "role", "plan", "step", "specializes", "bindings", "device_plan", "prelaunch")
BINDING_KEYS = ("source", "kind", "projection", "type", "expr", "size", "fields", "form", "box")
LAUNCH_KEYS = ("kernel", "params", "grid", "block", "shared_mem", "stream")
RESOURCE_KEYS = ("name", "dtype", "alignment", "shape")


@dataclass(frozen=True)
class Provider:
    """One direct-artifact provider: what its rows ship, how it is built and where its calls run."""

    name: str
    sources_key: str  # the row key that lists its sources
    suffixes: tuple[str, ...]  # accepted source file endings (headers included)
    device: str  # "cpu" or "cuda": where the artifact's calls run and its pointers point
    tools: tuple[str, ...]  # the fixed toolchain recorded in the seal
    device_launches: bool  # launches take grid/block/shared memory/stream; stream and TMA bindings exist
    single_unit: bool  # exactly one translation unit

    @property
    def projection(self) -> str:
        """The pointer projection its bindings take."""
        return "host_ptr" if self.device == "cpu" else "device_ptr"


# name -> provider; a new provider is a row here plus its admission and artifact modules (docs/architecture.md)
PROVIDERS: dict[str, Provider] = {p.name: p for p in (
    Provider("native.elf.v1", "native_sources", (".c", ".cc", ".cpp", ".h", ".hpp"), "cpu", ("gcc", "g++", "ld"), False, False),
    Provider("cuda.cubin.v1", "cuda_sources", (".cu", ".cuh", ".h"), "cuda", ("nvcc",), True, True),
)}
# Bounds of the form (the seed's: at most 256 launches and 64 bindings).
MAX_EXPORTS, MAX_BINDINGS, MAX_LAUNCHES, MAX_KERNELS = 32, 64, 256, 64
MAX_RESOURCES, MAX_PARAMS, MAX_FIELDS, MAX_SOURCES, MAX_SPECIALIZES = 32, 64, 32, 32, 8
MAX_RANK, MAX_ALIGNMENT, MAX_STRUCT = 8, 1 << 20, 4096
TMA_BYTES, DIVMOD_BYTES = 128, 12


class DirectError(ValueError):
    """A malformed direct-artifact field: ``key`` (relative to the row) and what is allowed."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


@dataclass(frozen=True)
class Field:
    offset: int
    type: str
    expr: Expr | None = None  # scalar fields
    binding: int | None = None  # ptr fields: a pointer binding's ordinal

    @property
    def width(self) -> int:
        return FIELD_TYPES[self.type]


@dataclass(frozen=True)
class Binding:
    """One typed projection of the call; ``width`` is its size as a kernel parameter."""

    kind: str
    source: str | None = None
    projection: str | None = None
    type: str | None = None
    expr: Expr | None = None
    size: int = 0
    fields: tuple[Field, ...] = ()
    form: str | None = None
    box: tuple[Expr, ...] = ()

    @property
    def width(self) -> int:
        if self.kind == "pointer":
            return 8
        if self.kind == "scalar":
            return SCALAR_TYPES[self.type or ""]
        if self.kind == "packed_struct":
            return self.size
        return {"tma_descriptor": TMA_BYTES, "fast_divmod": DIVMOD_BYTES}.get(self.kind, 0)

    def describe(self) -> str:
        if self.kind == "pointer":
            return f"pointer {self.source} ({self.projection})"
        if self.kind == "scalar":
            return f"scalar {self.type} = {self.source or self.expr.text}"  # type: ignore[union-attr]
        if self.kind == "packed_struct":
            return f"packed_struct {self.size} B, {len(self.fields)} field(s)"
        if self.kind == "fast_divmod":
            return f"fast_divmod[{self.form}] of {self.expr.text}"  # type: ignore[union-attr]
        if self.kind == "tma_descriptor":
            return f"tma_descriptor of {self.source}, box [{', '.join(e.text for e in self.box)}]"
        return f"{self.kind} {self.source}"


@dataclass(frozen=True)
class KernelDecl:
    name: str
    params: tuple[int, ...]  # byte width of every formal parameter


@dataclass(frozen=True)
class Launch:
    kernel: str
    params: tuple[int, ...]  # binding ordinals, in the kernel's parameter order
    grid: tuple[Expr, ...] = ()
    block: tuple[Expr, ...] = ()
    shared_mem: Expr | None = None
    stream: int | None = None  # ordinal of a stream binding (CUDA)


@dataclass(frozen=True)
class Prelaunch:
    target: str  # output.* or a resource
    value: float


@dataclass(frozen=True)
class Export:
    index: int
    provider: str
    name: str
    role: str
    plan: str
    step: int
    specializes: tuple[tuple[Expr, int | str], ...]
    bindings: tuple[Binding, ...]
    kernels: tuple[KernelDecl, ...]
    launches: tuple[Launch, ...]
    prelaunch: tuple[Prelaunch, ...]


@dataclass(frozen=True)
class Resource:
    name: str  # workspace.* / prepared.* / state.*
    dtype: str
    alignment: int
    shape: tuple[Expr, ...]

    @property
    def lifetime(self) -> str:
        return RESOURCE_PREFIXES[self.name.split(".", 1)[0]]


@dataclass(frozen=True)
class DirectOp:
    """A parsed direct-artifact row; ``declaration`` is the canonical raw form the seal stores."""

    slot: str
    provider: str
    sources: tuple[str, ...]  # relative to the bundle root
    exports: tuple[Export, ...]
    resources: tuple[Resource, ...]
    declaration: dict

    @property
    def digest(self) -> str:
        return declaration_digest(self.declaration)

    def kernels(self) -> tuple[KernelDecl, ...]:
        """The whole logical inventory of the artifact: sorted, unique names."""
        seen = {k.name: k for e in self.exports for k in e.kernels}
        return tuple(seen[n] for n in sorted(seen))

    def by_role(self, role: str) -> tuple[Export, ...]:
        return tuple(sorted((e for e in self.exports if e.role == role), key=lambda e: (e.step, e.index)))


def declaration_digest(declaration: dict) -> str:
    return hashlib.sha256(json.dumps(declaration, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def row_of(declaration: dict) -> dict:
    """The ``[[ops]]`` keys a stored declaration came from (to parse and join it again)."""
    key = PROVIDERS[declaration["provider"]].sources_key
    return {"aot_exports": declaration["aot_exports"], "artifact_resources": declaration["artifact_resources"],
            key: declaration["sources"]}


def is_direct_row(row: dict) -> bool:
    return any(k in row for k in DIRECT_KEYS)


# -- parsing ---------------------------------------------------------------------------------------
def _table(value: Any, key: str, allowed: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise DirectError(key, f"must be a table, got {value!r}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise DirectError(f"{key}.{unknown[0]}", f"unknown key; allowed: {', '.join(allowed)}")
    return value


def _list(value: Any, key: str, bound: int, *, empty: bool = False) -> list:
    if not isinstance(value, list) or (not value and not empty):
        raise DirectError(key, f"must be a {'' if empty else 'non-empty '}list, got {value!r}")
    if len(value) > bound:
        raise DirectError(key, f"{len(value)} entries; at most {bound}")
    return value


def _int(value: Any, key: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise DirectError(key, f"must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _choice(value: Any, key: str, allowed: tuple[str, ...] | dict) -> str:
    if value not in allowed:
        raise DirectError(key, f"{value!r} is not allowed; allowed: {', '.join(allowed)}")
    return value


def _expr(value: Any, key: str, **kw: Any) -> Expr:
    try:
        return parse_expr(value, **kw)
    except ExprError as exc:
        raise DirectError(key, str(exc)) from None


class _Scope:
    """What one role may read: call tensors, slot scalars, resources."""

    def __init__(self, slot: Slot, role: str, resources: dict[str, Resource]):
        self.role = role
        if role == "run":
            self.inputs = set(slot.names(Role.INPUT))
            self.outputs = set(slot.names(Role.OUTPUT))
            self.scalars = set(slot.names(Role.SCALAR))
        elif role == "prepare":
            self.inputs, self.outputs, self.scalars = set(slot.prepare_args), set(), set()
        else:
            self.inputs, self.outputs, self.scalars = set(), set(), set()
        allowed = {"run": ("workspace", "prepared", "state"), "prepare": ("prepared", "state")}.get(role, ("state",))
        self.resources = {n for n in resources if n.split(".", 1)[0] in allowed}
        self.all_resources = set(resources)

    def check_source(self, source: Any, key: str) -> str:
        if not isinstance(source, str):
            raise DirectError(key, f"must be a string such as 'input.x', got {source!r}")
        if source == "group" or source.startswith("group"):
            raise DirectError(key, "group projections fail closed: no group capability resolver is registered")
        prefix, _, name = source.partition(".")
        ok = {"input": self.inputs, "output": self.outputs, "scalar": self.scalars}.get(prefix)
        if ok is not None:
            if name in ok:
                return source
            raise DirectError(key, f"{source!r} is not available to {'an' if self.role[0] in 'aeiou' else 'a'} {self.role} export; it may bind "
                                   f"{self.available() or 'only state.* resources'}")
        if prefix in RESOURCE_PREFIXES:
            if source not in self.all_resources:
                raise DirectError(key, f"{source!r} is not declared in [[ops.artifact_resources]]")
            if source not in self.resources:
                raise DirectError(key, f"{source!r} ({prefix}.*) cannot be bound by a {self.role} export")
            return source
        if source == "stream.current":
            return source
        raise DirectError(key, f"unknown source {source!r}; sources are input.NAME, output.NAME, scalar.NAME, "
                               "workspace.NAME, prepared.NAME, state.NAME, stream.current")

    def available(self) -> str:
        names = [f"input.{n}" for n in sorted(self.inputs)] + [f"output.{n}" for n in sorted(self.outputs)]
        names += [f"scalar.{n}" for n in sorted(self.scalars)] + sorted(self.resources)
        return ", ".join(names)


def _tensor_of(source: str) -> str:
    prefix, _, name = source.partition(".")
    return name if prefix in ("input", "output") else source


def _parse_binding(raw: Any, key: str, provider: str, scope: _Scope) -> Binding:
    raw = _table(raw, key, BINDING_KEYS)
    kind = _choice(raw.get("kind"), f"{key}.kind", KINDS)
    if kind == "group_handle":
        raise DirectError(f"{key}.kind", "group_handle fails closed: no group capability resolver is registered for "
                                         f"{provider}")
    allowed = {"pointer": ("source", "kind", "projection"), "scalar": ("source", "kind", "type", "expr"),
               "packed_struct": ("kind", "size", "fields"), "fast_divmod": ("kind", "form", "expr"),
               "tma_descriptor": ("kind", "source", "type", "box"), "stream": ("kind", "source")}[kind]
    extra = sorted(set(raw) - set(allowed))
    if extra:
        raise DirectError(f"{key}.{extra[0]}", f"not a field of a {kind} binding; a {kind} binding takes {', '.join(allowed)}")
    if kind == "pointer":
        source = scope.check_source(raw.get("source"), f"{key}.source")
        if not source.startswith(("input.", "output.", *(p + "." for p in RESOURCE_PREFIXES))):
            raise DirectError(f"{key}.source", f"a pointer projects a tensor (input, output or resource), not {source!r}")
        want = PROVIDERS[provider].projection
        proj = _choice(raw.get("projection"), f"{key}.projection", ("host_ptr", "device_ptr"))
        if proj != want:
            raise DirectError(f"{key}.projection", f"{provider} launches take {want} projections, not {proj}")
        return Binding(kind, source=source, projection=proj)
    if kind == "scalar":
        typ = _choice(raw.get("type"), f"{key}.type", SCALAR_TYPES)
        if ("source" in raw) == ("expr" in raw):
            raise DirectError(key, "a scalar binding takes exactly one of `source` (a slot scalar) or `expr`")
        if "source" in raw:
            source = scope.check_source(raw["source"], f"{key}.source")
            if not source.startswith("scalar."):
                raise DirectError(f"{key}.source", f"a scalar binding's source is a slot scalar (scalar.NAME), not {source!r}")
            return Binding(kind, source=source, type=typ)
        if typ.startswith("f"):
            raise DirectError(f"{key}.type", "expressions are integer-valued; a float scalar takes `source = \"scalar.NAME\"`")
        return Binding(kind, type=typ, expr=_expr(raw["expr"], f"{key}.expr"))
    if kind == "stream":
        if not PROVIDERS[provider].device_launches:
            raise DirectError(f"{key}.kind", f"{provider} has no streams: a native call runs on the referee's calling thread")
        if raw.get("source") != "stream.current":
            raise DirectError(f"{key}.source", "the only stream is the validator's: source = \"stream.current\"")
        return Binding(kind, source="stream.current")
    if kind == "fast_divmod":
        form = _choice(raw.get("form"), f"{key}.form", ("cutlass", "cute"))
        return Binding(kind, form=form, expr=_expr(raw.get("expr"), f"{key}.expr"))
    if kind == "tma_descriptor":
        if not PROVIDERS[provider].device_launches:
            raise DirectError(f"{key}.kind", f"tma_descriptor is a CUDA tensor map; {provider} has none")
        source = scope.check_source(raw.get("source"), f"{key}.source")
        box = tuple(_expr(e, f"{key}.box[{i}]") for i, e in enumerate(_list(raw.get("box"), f"{key}.box", 5)))
        return Binding(kind, source=source, box=box)
    size = _int(raw.get("size"), f"{key}.size", 1, MAX_STRUCT)
    fields = []
    for j, f in enumerate(_list(raw.get("fields"), f"{key}.fields", MAX_FIELDS)):
        fk = f"{key}.fields[{j}]"
        f = _table(f, fk, ("offset", "type", "expr", "binding"))
        typ = _choice(f.get("type"), f"{fk}.type", FIELD_TYPES)
        off = _int(f.get("offset"), f"{fk}.offset", 0, size - 1)
        if off % FIELD_TYPES[typ] or off + FIELD_TYPES[typ] > size:
            raise DirectError(f"{fk}.offset", f"a {typ} at offset {off} must be {FIELD_TYPES[typ]}-aligned and end within {size} bytes")
        if typ == "ptr":
            if "binding" not in f or "expr" in f:
                raise DirectError(fk, "a ptr field takes `binding` (the ordinal of a pointer binding), not `expr`")
            fields.append(Field(off, typ, binding=_int(f["binding"], f"{fk}.binding", 0, MAX_BINDINGS - 1)))
        else:
            if "expr" not in f or "binding" in f or typ.startswith("f"):
                raise DirectError(fk, "a scalar field takes an integer type and `expr`")
            fields.append(Field(off, typ, expr=_expr(f["expr"], f"{fk}.expr")))
    spans = sorted((fl.offset, fl.offset + fl.width, j) for j, fl in enumerate(fields))
    for (a0, a1, ja), (b0, _, jb) in zip(spans, spans[1:]):
        if b0 < a1:
            raise DirectError(f"{key}.fields[{jb}]", f"overlaps field {ja} (bytes {a0}..{a1 - 1}); fields may not overlap")
    return Binding(kind, size=size, fields=tuple(fields))


def _binding_exprs(b: Binding) -> list[Expr]:
    return [e for e in (b.expr, *b.box, *(f.expr for f in b.fields)) if e is not None]


def _join(export_key: str, bindings: tuple[Binding, ...], exprs: list[tuple[str, Expr]]) -> None:
    """Every tensor an expression reads is bound by a pointer (or TMA) binding of the export;
    every scalar it reads is bound as a scalar of the slot."""
    tensors = {_tensor_of(b.source) for b in bindings if b.kind in ("pointer", "tma_descriptor") and b.source}
    scalars = {b.source.split(".", 1)[1] for b in bindings if b.kind == "scalar" and b.source}
    for key, e in exprs:
        for t in sorted(e.tensors - tensors):
            raise DirectError(key, f"{e.text!r} reads tensor {t!r}, which no pointer binding of this export projects "
                                   f"(bound: {', '.join(sorted(tensors)) or 'none'})")
        for s in sorted(e.scalars - scalars):
            raise DirectError(key, f"{e.text!r} reads {s!r}, which is not a scalar binding of this export "
                                   f"(bind it with source = \"scalar.{s}\")")


def _parse_export(i: int, raw: Any, slot: Slot, resources: dict[str, Resource]) -> Export:
    key = f"aot_exports[{i}]"
    raw = _table(raw, key, EXPORT_KEYS)
    provider = _choice(raw.get("provider"), f"{key}.provider", PROVIDERS)
    name = raw.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise DirectError(f"{key}.name", f"must be an identifier, got {name!r}")
    role = _choice(raw.get("role", "run"), f"{key}.role", ROLES)
    plan = raw.get("plan", "default")
    if not isinstance(plan, str) or not plan:
        raise DirectError(f"{key}.plan", f"must be a non-empty string, got {plan!r}")
    step = _int(raw.get("step", 0), f"{key}.step", 0, MAX_LAUNCHES)
    scope = _Scope(slot, role, resources)
    bindings = tuple(_parse_binding(b, f"{key}.bindings[{j}]", provider, scope)
                     for j, b in enumerate(_list(raw.get("bindings"), f"{key}.bindings", MAX_BINDINGS)))
    exprs = [(f"{key}.bindings[{j}]", e) for j, b in enumerate(bindings) for e in _binding_exprs(b)]
    for j, b in enumerate(bindings):
        for f in b.fields:
            if f.binding is not None and (f.binding >= len(bindings) or bindings[f.binding].kind != "pointer"):
                raise DirectError(f"{key}.bindings[{j}]", f"ptr field names binding {f.binding}, which is not a pointer binding")
    specs = []
    spec_raw = _table(raw.get("specializes", {}), f"{key}.specializes", tuple(raw.get("specializes", {}) or ()))
    if len(spec_raw) > MAX_SPECIALIZES:
        raise DirectError(f"{key}.specializes", f"{len(spec_raw)} predicates; at most {MAX_SPECIALIZES}")
    for text, value in spec_raw.items():
        e = _expr(text, f"{key}.specializes", allow_dtype=True)
        is_dtype = text.replace(" ", "").startswith("dtype(")
        if is_dtype != isinstance(value, str) or isinstance(value, bool) or not isinstance(value, (str, int)):
            raise DirectError(f"{key}.specializes", f"{text!r} = {value!r}: dtype() equals a dtype name, "
                                                    "every other expression an integer")
        specs.append((e, value))
        exprs.append((f"{key}.specializes", e))
    plan_raw = _table(raw.get("device_plan"), f"{key}.device_plan", ("kernels", "launches"))
    kernels = []
    for j, k in enumerate(_list(plan_raw.get("kernels"), f"{key}.device_plan.kernels", MAX_KERNELS)):
        kk = f"{key}.device_plan.kernels[{j}]"
        k = _table(k, kk, ("name", "params"))
        kname = k.get("name")
        if not isinstance(kname, str) or not kname.isidentifier():
            raise DirectError(f"{kk}.name", f"must be an identifier (the logical kernel name), got {kname!r}")
        widths = tuple(_int(w, f"{kk}.params[{n}]", 1, MAX_STRUCT)
                       for n, w in enumerate(_list(k.get("params"), f"{kk}.params", MAX_PARAMS, empty=True)))
        kernels.append(KernelDecl(kname, widths))
    names = [k.name for k in kernels]
    if names != sorted(set(names)):
        raise DirectError(f"{key}.device_plan.kernels", f"logical names must be sorted and unique, got {names}")
    by_name = {k.name: k for k in kernels}
    launches = []
    for j, ln in enumerate(_list(plan_raw.get("launches"), f"{key}.device_plan.launches", MAX_LAUNCHES)):
        lk = f"{key}.device_plan.launches[{j}]"
        ln = _table(ln, lk, LAUNCH_KEYS)
        kern = by_name.get(ln.get("kernel"))
        if kern is None:
            raise DirectError(f"{lk}.kernel", f"{ln.get('kernel')!r} is not in this export's kernels ({', '.join(names)})")
        params = tuple(_int(p, f"{lk}.params[{n}]", 0, len(bindings) - 1)
                       for n, p in enumerate(_list(ln.get("params"), f"{lk}.params", MAX_PARAMS, empty=True)))
        if len(params) != len(kern.params):
            raise DirectError(f"{lk}.params", f"{len(params)} parameter(s) for kernel {kern.name}, which declares {len(kern.params)}")
        for n, (p, w) in enumerate(zip(params, kern.params)):
            b = bindings[p]
            if b.kind == "stream":
                raise DirectError(f"{lk}.params[{n}]", "a stream binding is the launch's `stream`, not a parameter")
            if b.width != w:
                raise DirectError(f"{lk}.params[{n}]", f"binding {p} ({b.describe()}) is {b.width} bytes but kernel "
                                                       f"{kern.name} declares parameter {n} as {w} bytes")
        grid = tuple(_expr(e, f"{lk}.grid[{n}]") for n, e in enumerate(_list(ln.get("grid", []), f"{lk}.grid", 3, empty=True)))
        block = tuple(_expr(e, f"{lk}.block[{n}]") for n, e in enumerate(_list(ln.get("block", []), f"{lk}.block", 3, empty=True)))
        shared = _expr(ln["shared_mem"], f"{lk}.shared_mem") if "shared_mem" in ln else None
        stream = ln.get("stream")
        if not PROVIDERS[provider].device_launches:
            for field in ("grid", "block", "shared_mem", "stream"):
                if field in ln:
                    raise DirectError(f"{lk}.{field}", "native.elf.v1 launches are one host call on the calling thread: "
                                                       "no grid, block, shared memory or stream")
        else:
            if not grid or not block:
                raise DirectError(lk, "a cuda.cubin.v1 launch needs `grid` and `block` (1 to 3 expressions each)")
            stream = _int(stream, f"{lk}.stream", 0, len(bindings) - 1)
            if bindings[stream].kind != "stream":
                raise DirectError(f"{lk}.stream", f"binding {stream} is not a stream binding; there is no ambient stream")
        exprs += [(lk, e) for e in (*grid, *block, shared) if e is not None]
        launches.append(Launch(kern.name, params, grid, block, shared, stream))
    prelaunch = []
    for j, pl in enumerate(_list(raw.get("prelaunch", []), f"{key}.prelaunch", 8, empty=True)):
        pk = f"{key}.prelaunch[{j}]"
        pl = _table(pl, pk, ("op", "target", "value"))
        _choice(pl.get("op"), f"{pk}.op", ("fill",))
        target = pl.get("target")
        if not isinstance(target, str) or target.startswith(("input.", "scalar.")):
            raise DirectError(f"{pk}.target", f"a prelaunch fill may initialise only an output or an artifact resource, "
                                              f"not {target!r} (inputs are read-only)")
        scope.check_source(target, f"{pk}.target")
        if not any(b.source == target and b.kind in ("pointer", "tma_descriptor") for b in bindings):
            raise DirectError(f"{pk}.target", f"{target!r} is not projected by a binding of this export")
        value = pl.get("value", 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DirectError(f"{pk}.value", f"must be a number, got {value!r}")
        prelaunch.append(Prelaunch(target, float(value)))
    _join(key, bindings, exprs)
    return Export(i, provider, name, role, plan, step, tuple(specs), bindings, tuple(kernels), tuple(launches), tuple(prelaunch))


def _parse_resource(i: int, raw: Any, slot: Slot, earlier: dict[str, "Resource"]) -> Resource:
    key = f"artifact_resources[{i}]"
    raw = _table(raw, key, RESOURCE_KEYS)
    name = raw.get("name")
    prefix, _, rest = str(name).partition(".")
    if not isinstance(name, str) or prefix not in RESOURCE_PREFIXES or not rest.isidentifier():
        raise DirectError(f"{key}.name", f"must be workspace.NAME (call), prepared.NAME (prepare to run) or state.NAME "
                                         f"(engine lifetime), got {name!r}")
    dtype = _choice(raw.get("dtype"), f"{key}.dtype", RESOURCE_DTYPES)
    align = _int(raw.get("alignment", 64), f"{key}.alignment", 1, MAX_ALIGNMENT)
    if align & (align - 1):
        raise DirectError(f"{key}.alignment", f"must be a power of two, got {align}")
    shape = tuple(_expr(e, f"{key}.shape[{n}]") for n, e in enumerate(_list(raw.get("shape"), f"{key}.shape", MAX_RANK)))
    persistent = {n for n, r in earlier.items() if r.lifetime != "call"}  # declared above this one
    tensors = {"workspace": set(slot.names(Role.INPUT)) | set(slot.names(Role.OUTPUT)) | persistent,
               "prepared": set(slot.prepare_args), "state": set()}[prefix]
    scalars = set(slot.names(Role.SCALAR)) if prefix == "workspace" else set()
    for n, e in enumerate(shape):
        bad = sorted(e.tensors - tensors) + sorted(e.scalars - scalars)
        if bad:
            what = {"workspace": "the call's inputs, outputs and scalars and the prepared.*/state.* resources declared "
                                 "before it", "prepared": "the prepare arguments",
                    "state": "constants only (state is allocated before any call)"}[prefix]
            raise DirectError(f"{key}.shape[{n}]", f"{e.text!r} reads {bad[0]!r}; a {prefix}.* shape may read {what}")
    return Resource(name, dtype, align, shape)


def parse_direct(row: dict, slot: Slot, root: Path | None) -> DirectOp:
    """Parse the direct-artifact keys of one ``[[ops]]`` row (``root``: check the sources exist there)."""
    for key in ("source", "entry", "prepare"):
        if key in row:
            raise DirectError(key, "a direct-artifact row runs no Python: remove it (the referee launches the sealed artifact)")
    raw_resources = _list(row.get("artifact_resources", []), "artifact_resources", MAX_RESOURCES, empty=True)
    resources: dict[str, Resource] = {}
    for i, r in enumerate(raw_resources):
        res = _parse_resource(i, r, slot, resources)
        if res.name in resources:
            raise DirectError(f"artifact_resources[{i}].name", f"{res.name} is declared twice")
        resources[res.name] = res
    exports = tuple(_parse_export(i, e, slot, resources)
                    for i, e in enumerate(_list(row.get("aot_exports"), "aot_exports", MAX_EXPORTS)))
    providers = sorted({e.provider for e in exports})
    if len(providers) > 1:
        raise DirectError("aot_exports", f"one row, one provider; got {', '.join(providers)}")
    provider = providers[0]
    names = [e.name for e in exports]
    if len(set(names)) != len(names):
        raise DirectError("aot_exports", f"export names repeat: {names}")
    _check_lifecycle(exports, slot, resources)
    inventory: dict[str, KernelDecl] = {}
    for e in exports:
        for k in e.kernels:
            if inventory.setdefault(k.name, k) != k:
                raise DirectError(f"aot_exports[{e.index}].device_plan.kernels", f"kernel {k.name} is declared with "
                                  f"parameters {list(k.params)} here and {list(inventory[k.name].params)} elsewhere")
    src_key, suffixes = PROVIDERS[provider].sources_key, PROVIDERS[provider].suffixes
    other = next(p.sources_key for p in PROVIDERS.values() if p.sources_key != src_key)
    if other in row:
        raise DirectError(other, f"the row's provider is {provider}; its sources go in `{src_key}`")
    sources = tuple(_list(row.get(src_key), src_key, MAX_SOURCES))
    for j, s in enumerate(sources):
        sk = f"{src_key}[{j}]"
        if not isinstance(s, str) or not s.endswith(suffixes) or Path(s).is_absolute() or ".." in Path(s).parts:
            raise DirectError(sk, f"must be a relative path inside the bundle ending in {' '.join(suffixes)}, got {s!r}")
        if root is not None and not (root / s).is_file():
            raise DirectError(sk, f"{s!r} does not exist in the bundle")
    units = [s for s in sources if not s.endswith((".h", ".hpp", ".cuh"))]
    if not units or (PROVIDERS[provider].single_unit and len(units) != 1):
        raise DirectError(src_key, "needs one translation unit (.cu) for a CUBIN" if PROVIDERS[provider].single_unit
                          else "needs at least one C/C++ translation unit (.c, .cc, .cpp)")
    declaration = {"slot": slot.name, "provider": provider, "sources": list(sources),
                   "aot_exports": row["aot_exports"], "artifact_resources": raw_resources}
    return DirectOp(slot.name, provider, sources, exports, tuple(resources.values()), declaration)


def _check_lifecycle(exports: tuple[Export, ...], slot: Slot, resources: dict[str, Resource]) -> None:
    run = [e for e in exports if e.role == "run"]
    if not run:
        raise DirectError("aot_exports", "no export has role = \"run\"; the slot's work happens in run")
    prep = [e for e in exports if e.role == "prepare"]
    if slot.needs_prepare and not prep:
        raise DirectError("aot_exports", f"slot {slot.name} has a prepare step ({slot.signature()}); declare a role = \"prepare\" export")
    if prep and not slot.needs_prepare:
        raise DirectError(f"aot_exports[{prep[0].index}].role", f"slot {slot.name} has no prepare step")
    bound = {r: {b.source for e in exports if e.role == r for b in e.bindings} for r in ROLES}
    for name, res in resources.items():
        if res.lifetime == "prepared" and not (name in bound["prepare"] and name in bound["run"]):
            raise DirectError("artifact_resources", f"{name} must be produced by a prepare export and consumed by a run export")
        if not any(name in s for s in bound.values()):
            raise DirectError("artifact_resources", f"{name} is declared but no export binds it")
