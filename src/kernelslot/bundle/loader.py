"""Loading a bundle: static checks (no candidate code runs) and candidates for the referee.

Candidates carry a :class:`KernelSource` pointing at the bundle file; the callables are
resolved lazily by the runner that executes them (in this process for the in-process runner,
in the worker for the isolated one), so scanning and isolated verification never import
candidate code into the referee.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable

from kernelslot.bundle.domain import rebound
from kernelslot.bundle.hashing import bundle_hash
from kernelslot.bundle.manifest import Manifest, ManifestError, load_manifest
from kernelslot.kernels.moe_overrides import BASES, compose
from kernelslot.slots import CATALOG, Candidate, Kernel
from kernelslot.slots.base import KernelSource, Needs, Override
from kernelslot.slots.models import model_profile


# Signatures the arena published earlier for a slot (with their positional arity): a bundle
# written for one gets a message naming it and the current signature.
EARLIER_SIGNATURES = {
    "attention.decode": ("dense decode entry(q, k, v, seq_lens, sm_scale, out)", 6),
    "attention.msa_prefill_block_score": ("6-argument score sheet entry(q, index_k, prefix_len, scale, block_size, out)", 6),
}


@dataclass(frozen=True)
class SourceFacts:
    """What a bundle source defines and imports, read from its syntax tree (nothing runs)."""

    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]  # module-level, also inside if/try blocks
    assigned: frozenset[str]
    packages: tuple[str, ...]  # top-level packages imported unguarded at module level (not the bundle's own)
    referee_import: str | None

    def defines(self, name: str) -> bool:
        return name in self.defs or name in self.assigned


def _module_level(body: list[ast.stmt], guarded: bool = False):
    """Module-level statements, descending into if/try blocks; yields (statement, inside an ImportError guard)."""
    for node in body:
        yield node, guarded
        if isinstance(node, ast.If):
            yield from _module_level(node.body + node.orelse, guarded)
        elif isinstance(node, ast.Try):
            catches = any(h.type is None or "ImportError" in ast.unparse(h.type) or "Exception" in ast.unparse(h.type)
                          for h in node.handlers)
            yield from _module_level(node.body, guarded or catches)
            yield from _module_level(node.orelse + node.finalbody, guarded)
            for h in node.handlers:
                yield from _module_level(h.body, guarded)


def source_facts(path: Path) -> SourceFacts:
    """Facts of one source file; raises SyntaxError (or UnicodeDecodeError) if it does not parse."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    defs: dict = {}
    assigned: set[str] = set()
    packages: list[str] = []
    for node, guarded in _module_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.setdefault(node.name, node)
        elif isinstance(node, ast.Assign):
            assigned.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif not guarded and isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for top in (n.split(".")[0] for n in names):
                local = (path.parent / f"{top}.py").exists() or (path.parent / top).is_dir()
                if top and not local and top not in packages:
                    packages.append(top)
    referee = None
    for node in ast.walk(tree):
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        referee = referee or next((m for m in mods if m.startswith(("kernelslot.verify", "kernelslot.abi.comparators"))), None)
    return SourceFacts(defs, frozenset(assigned), tuple(packages), referee)


@dataclass(frozen=True)
class Bundle:
    manifest: Manifest
    content_hash: str
    seals: dict = field(default_factory=dict)  # op index -> its Seal (direct-artifact rows)
    unbuilt: dict = field(default_factory=dict)  # op index -> why this machine cannot build it (not run)
    facts: tuple = ()  # per op row: its SourceFacts (None for a direct-artifact row)

    @property
    def bundle_id(self) -> str:
        return self.manifest.bundle_id

    def candidates(self, model: str | None = None, device: str | None = None) -> dict[str, list[Candidate]]:
        """Slot name -> its variants as candidates (callables resolved lazily by the runner).

        Each carries its row's effective domain and bound model; ``model`` (``verify --model``)
        rebinds every row to that model profile instead. Rows this machine cannot build are left
        out, unless ``device`` (the device a verification runs on) is given: then they, and direct
        rows whose provider cannot run on ``device``, come with ``needs.blocked`` set to why, so
        that their verdict is *not run* while the bundle's other rows run.
        """
        from kernelslot.bundle.direct import not_run_reason

        out: dict[str, list[Candidate]] = {}
        for row, facts in zip(self.manifest.ops, self.facts or [None] * len(self.manifest.ops)):
            blocked = self.unbuilt.get(row.index) or (
                row.direct is not None and device is not None and not_run_reason(row.direct, device)) or None
            if row.index in self.unbuilt and device is None:
                continue
            bound = model or row.model
            name = f"{self.bundle_id}:{row.label}"
            if row.direct is not None:  # the referee's launcher for the sealed artifact
                seal = self.seals.get(row.index)
                src = KernelSource(entry="run", prepare="prepare" if row.direct.by_role("prepare") else None,
                                   sealed=seal.handle if seal else None)
            elif row.base_kernel:
                attr = override_attr(row.entry, facts)
                src = KernelSource(entry=row.entry, prepare=f"{row.base_kernel}.prepare", file=str(self.manifest.root / row.source),
                                   override=Override(row.base_kernel, row.override_point, attr, bound))
                name += f"[{attr} in {row.base_kernel}.{row.override_point}]"
            else:
                src = KernelSource(entry=row.entry, prepare=row.prepare, file=str(self.manifest.root / row.source))
            kernel = Kernel(entry=None, prepare=None, name=name, source=src)
            packages = facts.packages if facts else ()
            needs = Needs(() if row.base_kernel else row.architectures, packages, blocked,
                          interpret=not row.base_kernel and "triton" in packages)
            domain = row.domain if model is None else rebound(row.domain, model)
            out.setdefault(row.slot, []).append(Candidate(kernel, domain, row.graph_safe, kernel.name, bound, needs))
        return out


def override_attr(entry: str, facts: SourceFacts | None) -> str:
    """The callable an override row composes into its torch base: ``<entry>_ref`` (its torch
    reference) when the source defines one, else ``entry``."""
    return f"{entry}_ref" if facts is not None and facts.defines(f"{entry}_ref") else entry


def load_bundle(path: str | Path) -> Bundle:
    manifest = load_manifest(path)
    facts, problems = _scan(manifest)
    if problems:
        raise ManifestError(problems[0])
    return Bundle(manifest, bundle_hash(manifest.root), *seal_direct_rows(manifest), facts=tuple(facts))


def seal_direct_rows(manifest: Manifest) -> tuple[dict, dict]:
    """Build and seal every direct-artifact row (referee-owned builder; reused while unchanged).

    Returns the seals and, for rows whose toolchain this machine lacks, why they are not built."""
    from kernelslot.bundle.direct import AdmissionError, SealError, ToolchainMissing, admit_static, build_and_seal

    seals, unbuilt = {}, {}
    for row in manifest.ops:
        if row.direct is not None:
            try:
                seal = seals[row.index] = build_and_seal(row.direct, manifest.root)
                admit_static(row.direct, seal.artifact, seal.index.get("baseline", {}))
            except ToolchainMissing as exc:
                unbuilt[row.index] = str(exc)
            except (SealError, AdmissionError) as exc:
                raise ManifestError(f"{manifest.path}: ops[{row.index}]: {exc}") from None
    return seals, unbuilt


def _accepts(fn: ast.FunctionDef | ast.AsyncFunctionDef, n: int) -> tuple[bool, str]:
    """Whether ``fn`` can be called with ``n`` positional arguments (and how many it takes)."""
    a = fn.args
    total = len(a.posonlyargs) + len(a.args)
    required = total - len(a.defaults)
    kw_required = sum(d is None for d in a.kw_defaults)
    ok = required <= n and (n <= total or a.vararg is not None) and kw_required == 0
    takes = f"{required}" if required == total else f"{required}-{total}"
    return ok, takes + ("+" if a.vararg else "")


def static_problems(manifest: Manifest) -> list[str]:
    """Checks made without running candidate code: entry/prepare defined with the slot's arity."""
    return _scan(manifest)[1]


def _read_facts(manifest: Manifest, row) -> tuple[SourceFacts | None, str | None]:
    where = f"{manifest.path}: ops[{row.index}]"
    try:
        return source_facts(manifest.root / row.source), None
    except UnicodeDecodeError as exc:
        return None, f"{where}.source: {row.source} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
    except SyntaxError as exc:
        return None, f"{where}.source: {row.source} does not parse: {exc.msg} (line {exc.lineno})"


def _scan(manifest: Manifest) -> tuple[list[SourceFacts | None], list[str]]:
    """Each row's source facts (None where unreadable) and every static problem found."""
    problems: list[str] = []
    all_facts: list[SourceFacts | None] = []
    for row in manifest.ops:
        if row.direct is not None:  # no Python: parsed, joined and bounded by the manifest already
            all_facts.append(None)
            continue
        where = f"{manifest.path}: ops[{row.index}]"
        f, problem = _read_facts(manifest, row)
        all_facts.append(f)
        if f is None:
            problems.append(problem)
            continue
        slot = CATALOG[row.slot].slot
        if row.base_kernel:
            attr = override_attr(row.entry, f)
            checks = [("entry", attr, BASES[row.base_kernel].points[row.override_point])]
        else:
            checks = [("entry", row.entry, len(slot.args)), ("prepare", row.prepare, len(slot.prepare_args))]
        for key, name, want in checks:
            if name is None:
                continue
            if name in f.defs:
                ok, takes = _accepts(f.defs[name], want)
                earlier = EARLIER_SIGNATURES.get(row.slot)
                if not ok and key == "entry" and earlier and _accepts(f.defs[name], earlier[1])[0] and not row.base_kernel:
                    problems.append(f"{where}.entry: {name}() is written for the arena's earlier {row.slot} signature, "
                                    f"the {earlier[0]}; the current signature is {slot.signature()}")
                elif not ok:
                    passes = f"{row.override_point} passes {want}" if row.base_kernel else f"the slot passes {want}: {slot.signature()}"
                    problems.append(f"{where}.{key}: {name}() takes {takes} positional arguments, {passes}")
            elif not f.defines(name):
                problems.append(f"{where}.{key}: {row.source} defines no top-level {name!r}")
        if f.referee_import:
            problems.append(f"{where}.source: {row.source} imports the referee ({f.referee_import}); a candidate never imports the referee")
    return all_facts, problems


_MODULES: dict[str, ModuleType] = {}


def load_source_module(file: str) -> ModuleType:
    """Import a bundle source file once per process (its directory is importable meanwhile)."""
    if file in _MODULES:
        return _MODULES[file]
    path = Path(file)
    name = f"bundle_{hashlib.sha1(file.encode()).hexdigest()[:10]}_{path.stem}"  # says nothing about the referee
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    _MODULES[file] = module
    return module


def interpret_triton() -> None:
    """Run every ``@triton.jit`` function decorated from now on in this process under Triton's
    interpreter (``TRITON_INTERPRET=1``; triton reads it at decoration time). Raises ImportError
    where triton was already imported without it: its own ``tl.sigmoid``, ``tl.sum``, ... were
    then decorated for the compiler, and an interpreted kernel could not call them."""
    os.environ["TRITON_INTERPRET"] = "1"
    language = sys.modules.get("triton.language")
    if language is not None and type(getattr(language, "sigmoid", None)).__name__ == "JITFunction":
        raise ImportError("triton was imported in this process before TRITON_INTERPRET=1 was set, so its own "
                          "functions (tl.sigmoid, tl.sum, ...) are compiled-only; run the interpreted candidate in a "
                          "process that sets it first (the worker runner does)")


def resolve_callables(source: KernelSource) -> tuple[Callable, Callable | None]:
    """The entry and prepare callables a :class:`KernelSource` names (for an override: the
    built-in base composed with the override's callable); an ``interpret`` source is imported
    under Triton's interpreter (:func:`interpret_triton`)."""
    if source.interpret:
        interpret_triton()
    if source.sealed:  # a sealed direct artifact: the referee's launcher, admitted in this process
        from kernelslot.bundle.direct import open_sealed

        artifact = open_sealed(source.sealed)
        return artifact, artifact.prepare if source.prepare else None
    module = load_source_module(source.file) if source.file else importlib.import_module(source.module or "")
    def get(attr: str) -> Callable:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                raise ImportError(f"{source.file or source.module} has no attribute {attr!r}")
        if not callable(obj):
            raise ImportError(f"{source.file or source.module}:{attr} is not callable")
        return obj
    if source.override is not None:
        o = source.override
        return compose(o.base, o.point, get(o.attr), model_profile(o.model).activation)
    return get(source.entry), get(source.prepare) if source.prepare else None


class CandidateLoadError(RuntimeError):
    """Importing a candidate's source failed (the message holds the traceback)."""


def resolve_kernel(kernel: Kernel) -> tuple[Callable, Callable | None]:
    """The kernel's callables, importing its source (e.g. a bundle file) when it has none yet.

    Imports run in the calling process: the referee calls this only inside a sandboxed child, or
    for trusted (built-in) kernels and explicit in-process runs.
    """
    if kernel.entry is not None:
        return kernel.entry, kernel.prepare
    try:
        return resolve_callables(kernel.origin())
    except Exception:
        raise CandidateLoadError(f"{kernel.name}: loading the candidate failed:\n" + traceback.format_exc(limit=6)) from None
