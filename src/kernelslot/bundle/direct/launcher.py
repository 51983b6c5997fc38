"""The referee-owned launcher: what a direct-artifact candidate's ``entry`` and ``prepare`` are.

:func:`open_sealed` (reached through ``resolve_callables`` for a ``KernelSource`` with
``sealed``) runs in whichever process executes the candidate — the worker, by default. It
re-verifies the seal against the index digest the referee handed over, parses and joins the
stored declaration again, admits the object with its provider, allocates ``state.*`` and runs the
``init`` exports. Then, with no candidate Python anywhere:

* ``prepare(*prepare_args)`` runs the ``reset`` exports (from the second prepare on), allocates
  and poisons the ``prepared.*`` resources, runs the ``prepare`` exports and returns a
  :class:`PreparedArtifact` (the slot's prepared object);
* ``artifact(*slot_args)`` (the entry) allocates and poisons ``workspace.*``, and runs the ``run``
  exports; each export is chosen per ``step`` by its ``specializes`` predicates (exactly one must
  match), its ``prelaunch`` fills are made, its bindings are materialised from the live call and
  its launches are made in order;
* ``destroy`` exports run when the process exits.

AOT evidence: every call leaves ``aot_loaded:<index digest>``, one ``aot_invoked:<export>`` per export
that returned, and ``completed``; :meth:`DirectArtifact.take_evidence` hands them to the runner,
and :func:`evidence_problem` is the referee's judgement of them (a ``fallback`` disqualifies).
"""
from __future__ import annotations

import atexit
import ctypes
import struct
from typing import Any

import torch

from kernelslot.bundle.direct.admit import AdmissionError
from kernelslot.bundle.direct.expr import ExprError, TensorFacts
from kernelslot.bundle.direct.seal import Seal, open_seal
from kernelslot.bundle.direct.spec import PROVIDERS, Binding, DirectError, DirectOp, Export, Launch, parse_direct, row_of

MAX_RESOURCE_BYTES = 4 << 30
MAX_SHARED_MEM = 1 << 20
_PACK = {"i8": "b", "u8": "B", "i16": "h", "u16": "H", "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "f32": "f", "f64": "d"}
_CT = {"i8": ctypes.c_int8, "u8": ctypes.c_uint8, "i16": ctypes.c_int16, "u16": ctypes.c_uint16, "i32": ctypes.c_int32,
       "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64, "f32": ctypes.c_float, "f64": ctypes.c_double}


class LaunchError(RuntimeError):
    """A call the artifact's plan cannot serve (no matching export, a value out of range, ...)."""


def evidence_problem(evidence: list[str] | tuple[str, ...]) -> str | None:
    """``None`` when a call's AOT evidence proves the admitted artifact produced it, else why not."""
    kinds = [r.split(":", 1)[0] for r in evidence]
    if "fallback" in kinds:
        return "a fallback receipt: the call was not served by the admitted artifact (disqualifies)"
    if not kinds or kinds[0] != "aot_loaded":
        return "no aot_loaded receipt: the call did not go through the admitted direct artifact"
    if "aot_invoked" not in kinds:
        return "no aot_invoked receipt: the artifact was loaded but never launched"
    if kinds[-1] != "completed":
        return "no completed receipt: the launcher did not finish the call"
    return None


def _poison(t: torch.Tensor) -> None:
    t.fill_(float("nan") if t.dtype.is_floating_point else int(torch.iinfo(t.dtype).min))


def _check_range(typ: str, v: int | float, what: str) -> None:
    if typ.startswith("f"):
        return
    bits = int(typ[1:])
    lo, hi = (-(1 << bits - 1), (1 << bits - 1) - 1) if typ[0] == "i" else (0, (1 << bits) - 1)
    if not lo <= v <= hi:
        raise LaunchError(f"{what} = {v} does not fit {typ}")


class PreparedArtifact:
    """The slot's prepared object for a direct artifact: the ``prepared.*`` storage, referee-allocated."""

    def __init__(self, owner: "DirectArtifact", resources: dict[str, torch.Tensor]):
        self.owner, self.resources = owner, resources

    def __repr__(self) -> str:
        return f"PreparedArtifact({', '.join(self.resources)})"


class _Context:
    """The live facts of one role invocation: tensors by name, slot scalars, the stream."""

    def __init__(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any], device: torch.device):
        self.tensors, self.scalars, self.device = tensors, scalars, device
        self.facts = {n: TensorFacts.of(t) for n, t in tensors.items()}
        self.ints = {n: v for n, v in scalars.items() if isinstance(v, int) and not isinstance(v, bool)}

    def eval(self, e: Any) -> Any:
        try:
            return e.eval(self.facts, self.ints)
        except ExprError as exc:
            raise LaunchError(str(exc)) from None

    def dims(self, ln: Launch) -> tuple[list[int], list[int], int, int]:
        grid = [self.eval(e) for e in ln.grid] + [1] * (3 - len(ln.grid))
        block = [self.eval(e) for e in ln.block] + [1] * (3 - len(ln.block))
        shared = self.eval(ln.shared_mem) if ln.shared_mem is not None else 0
        if any(d < 1 or d >= 1 << 31 for d in grid + block) or not 0 <= shared <= MAX_SHARED_MEM:
            raise LaunchError(f"launch of {ln.kernel}: grid {grid}, block {block}, shared {shared} out of bounds")
        return grid, block, shared, torch.cuda.current_stream().cuda_stream


class DirectArtifact:
    """One admitted sealed artifact in this process (see the module docstring for the lifecycle)."""

    def __init__(self, handle: str):
        path, _, digest = handle.rpartition("@")
        self.seal: Seal = open_seal(path, digest)
        from kernelslot.slots import CATALOG

        index = self.seal.index
        self.slot = CATALOG[index["slot"]].slot
        try:
            self.op: DirectOp = parse_direct(row_of(index["declaration"]), self.slot, None)
        except (DirectError, KeyError, TypeError) as exc:  # the stored declaration no longer parses or joins
            raise AdmissionError(f"the sealed declaration is not admissible: {exc}") from None
        if self.op.digest != index["declaration_digest"]:
            raise AdmissionError("the sealed declaration does not reproduce its digest")
        if PROVIDERS[self.op.provider].device == "cuda":
            from kernelslot.bundle.direct.cuda import CudaArtifact

            self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cuda")
            self.provider: Any = CudaArtifact(self.op, self.seal)
        else:
            from kernelslot.bundle.direct.native import NativeArtifact

            self.device = torch.device("cpu")
            self.provider = NativeArtifact(self.op, self.seal)
        self.loaded = f"aot_loaded:{self.seal.digest[:16]}"
        self._evidence: list[str] = []
        self._prepares = 0
        self._steps: dict[str, list] = {}
        self.state = {r.name: self._allocate(r, _Context({}, {}, self.device), zero=True) for r in self.op.resources
                      if r.lifetime == "engine"}
        self._role("init", _Context(dict(self.state), {}, self.device))
        atexit.register(self._destroy)

    # -- the slot-facing callables ---------------------------------------------------------------
    def prepare(self, *prepare_args: Any) -> PreparedArtifact:
        if len(prepare_args) != len(self.slot.prepare_args):
            raise LaunchError(f"prepare takes {len(self.slot.prepare_args)} arguments ({', '.join(self.slot.prepare_args)})")
        tensors = {}
        for name, value in zip(self.slot.prepare_args, prepare_args):
            if not isinstance(value, torch.Tensor):
                raise LaunchError(f"prepare argument {name} is {type(value).__name__}, not a tensor: a direct artifact's "
                                  "native prepare ABI takes tensors only (the tagged NVFP4 view has no native form)")
            tensors[name] = value
        if self._prepares:
            self._role("reset", _Context(dict(self.state), {}, self.device))
        self._prepares += 1
        ctx = _Context({**tensors, **self.state}, {}, self.device)
        prepared = {r.name: self._allocate(r, ctx) for r in self.op.resources if r.lifetime == "prepared"}
        ctx = _Context({**tensors, **self.state, **prepared}, {}, self.device)
        self._role("prepare", ctx)
        return PreparedArtifact(self, prepared)

    def __call__(self, *args: Any) -> None:
        evidence = [self.loaded]
        tensors, scalars, prepared = {}, {}, {}
        for a, value in zip(self.slot.args, args):
            if a.role.value in ("input", "output"):
                if value is not None:
                    tensors[a.name] = value
            elif a.role.value == "scalar":
                scalars[a.name] = value
            elif a.role.value == "prepared":
                if not isinstance(value, PreparedArtifact) or value.owner is not self:
                    raise LaunchError(f"the prepared argument is {value!r}, not this artifact's prepared state")
                prepared = value.resources
        ctx = _Context({**tensors, **self.state, **prepared}, scalars, self.device)
        workspace = {r.name: self._allocate(r, ctx) for r in self.op.resources if r.lifetime == "call"}
        ctx = _Context({**tensors, **self.state, **prepared, **workspace}, scalars, self.device)
        evidence += self._role("run", ctx)
        self.provider.synchronize()
        self._evidence += [*evidence, "completed"]
        return None

    def take_evidence(self) -> list[str]:
        out, self._evidence = self._evidence, []
        return out

    # -- internals --------------------------------------------------------------------------------
    def _allocate(self, r: Any, ctx: _Context, zero: bool = False) -> torch.Tensor:
        shape = [int(ctx.eval(e)) for e in r.shape]
        dtype = getattr(torch, r.dtype)
        numel = 1
        for s in shape:
            if s < 0:
                raise LaunchError(f"resource {r.name}: negative extent in shape {shape}")
            numel *= s
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        if nbytes > MAX_RESOURCE_BYTES:
            raise LaunchError(f"resource {r.name} of shape {shape} needs {nbytes} bytes; at most {MAX_RESOURCE_BYTES}")
        raw = torch.empty(nbytes + r.alignment, dtype=torch.uint8, device=self.device)
        start = (-raw.data_ptr()) % r.alignment
        t = raw[start:start + nbytes].view(dtype).view(shape)
        if zero:
            t.zero_()
        else:
            _poison(t)
        return t

    def _role(self, role: str, ctx: _Context) -> list[str]:
        if role not in self._steps:
            exports = self.op.by_role(role)
            self._steps[role] = [(s, [e for e in exports if e.step == s]) for s in sorted({e.step for e in exports})]
        evidence = []
        for step, here in self._steps[role]:
            chosen = [e for e in here if all(ctx.eval(x) == want for x, want in e.specializes)]
            if len(chosen) != 1:
                facts = sorted({f"{x.text}={ctx.eval(x)}" for e in here for x, _ in e.specializes})
                what = "no export" if not chosen else f"{len(chosen)} exports ({', '.join(e.name for e in chosen)})"
                raise LaunchError(f"{what} of role {role}, step {step} match this call ({', '.join(facts)}); "
                                  "the plan must select exactly one")
            self._run_export(chosen[0], ctx)
            evidence.append(f"aot_invoked:{chosen[0].name}")
        return evidence

    def _run_export(self, e: Export, ctx: _Context) -> None:
        for fill in e.prelaunch:
            ctx.tensors[fill.target.removeprefix("output.")].fill_(fill.value)
        values = [self._materialise(b, ctx, e) for b in e.bindings]
        for j, ln in enumerate(e.launches):
            self.provider.launch(e.index, j, ln, [values[p] for p in ln.params], ctx)

    def _tensor(self, source: str, ctx: _Context) -> torch.Tensor:
        name = source.split(".", 1)[1] if source.startswith(("input.", "output.")) else source
        t = ctx.tensors.get(name)
        if t is None:
            raise LaunchError(f"{source} is not supplied to this call")
        want = PROVIDERS[self.op.provider].device
        if t.device.type != want:
            raise LaunchError(f"{source} is on {t.device}; {self.op.provider} projects {want} pointers")
        return t

    def _materialise(self, b: Binding, ctx: _Context, e: Export) -> Any:
        if b.kind == "pointer":
            return ctypes.c_void_p(self._tensor(b.source or "", ctx).data_ptr())
        if b.kind == "stream":
            return None
        if b.kind == "scalar":
            v = ctx.scalars.get(b.source.split(".", 1)[1]) if b.source else ctx.eval(b.expr)
            if b.type.startswith("f"):  # type: ignore[union-attr]
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise LaunchError(f"{b.source} is {v!r}, not a number")
            elif isinstance(v, bool) or not isinstance(v, int):
                raise LaunchError(f"{b.source or b.expr} is {v!r}, not an integer (a {b.type} binding packs integers exactly)")
            _check_range(b.type or "", v, b.source or b.expr.text)  # type: ignore[union-attr]
            return _CT[b.type or ""](v)
        if b.kind == "fast_divmod":
            from kernelslot.bundle.direct.native import fast_divmod

            try:
                return fast_divmod(int(ctx.eval(b.expr)))
            except ValueError as exc:
                raise LaunchError(str(exc)) from None
        if b.kind == "tma_descriptor":
            from kernelslot.bundle.direct.cuda import tma_descriptor

            t = self._tensor(b.source or "", ctx)
            return tma_descriptor(t.data_ptr(), str(t.dtype).removeprefix("torch."), tuple(t.shape), tuple(t.stride()),
                                  t.element_size(), [int(ctx.eval(x)) for x in b.box])
        frame = bytearray(b.size)  # packed_struct: zeroed, then every field at its checked offset
        for f in b.fields:
            if f.type == "ptr":
                value = self._tensor(e.bindings[f.binding].source or "", ctx).data_ptr()  # type: ignore[index]
                struct.pack_into("<Q", frame, f.offset, value)
            else:
                v = ctx.eval(f.expr)
                _check_range(f.type, v, f.expr.text)  # type: ignore[union-attr]
                struct.pack_into("<" + _PACK[f.type], frame, f.offset, v)
        return bytes(frame)

    def _destroy(self) -> None:
        try:
            self._role("destroy", _Context(dict(self.state), {}, self.device))
        except Exception:  # noqa: BLE001 - at exit there is nobody to report to
            pass


_OPEN: dict[str, DirectArtifact] = {}


def open_sealed(handle: str) -> DirectArtifact:
    """The admitted artifact for ``DIR@INDEX_SHA256`` in this process (admitted once per process)."""
    if handle not in _OPEN:
        _OPEN[handle] = DirectArtifact(handle)
    return _OPEN[handle]
