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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable

from kernelslot.bundle.hashing import bundle_hash
from kernelslot.bundle.manifest import Manifest, ManifestError, load_manifest
from kernelslot.slots import CATALOG, Candidate, Kernel
from kernelslot.slots.base import KernelSource


@dataclass(frozen=True)
class Bundle:
    manifest: Manifest
    content_hash: str
    seals: dict = field(default_factory=dict)  # op index -> its Seal (direct-artifact rows)
    unbuilt: dict = field(default_factory=dict)  # op index -> why this machine cannot build it (not run)

    @property
    def bundle_id(self) -> str:
        return self.manifest.bundle_id

    def candidates(self) -> dict[str, list[Candidate]]:
        """Slot name -> its variants as candidates (callables resolved lazily by the runner)."""
        out: dict[str, list[Candidate]] = {}
        for row in self.manifest.ops:
            if row.index in self.unbuilt:
                continue
            if row.direct is not None:  # the referee's launcher for the sealed artifact
                src = KernelSource(entry="run", prepare="prepare" if row.direct.by_role("prepare") else None,
                                   sealed=self.seals[row.index].handle)
            else:
                src = KernelSource(entry=row.entry, prepare=row.prepare, file=str(self.manifest.root / row.source))
            kernel = Kernel(entry=None, prepare=None, name=f"{self.bundle_id}:{row.label}", source=src)
            out.setdefault(row.slot, []).append(Candidate(kernel, row.domain, row.graph_safe, kernel.name, row.model))
        return out


def load_bundle(path: str | Path) -> Bundle:
    manifest = load_manifest(path)
    problems = static_problems(manifest)
    if problems:
        raise ManifestError(problems[0])
    return Bundle(manifest, bundle_hash(manifest.root), *seal_direct_rows(manifest))


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
    problems = []
    for row in manifest.ops:
        if row.direct is not None:  # no Python: parsed, joined and bounded by the manifest already
            continue
        src_path = manifest.root / row.source
        where = f"{manifest.path}: ops[{row.index}]"
        try:
            tree = ast.parse(src_path.read_text(encoding="utf-8"), filename=str(src_path))
        except UnicodeDecodeError as exc:
            problems.append(f"{where}.source: {row.source} is not UTF-8 text (byte {exc.start}); save it as UTF-8")
            continue
        except SyntaxError as exc:
            problems.append(f"{where}.source: {row.source} does not parse: {exc.msg} (line {exc.lineno})")
            continue
        defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        slot = CATALOG[row.slot].slot
        for key, name, want in (("entry", row.entry, len(slot.args)), ("prepare", row.prepare, len(slot.prepare_args))):
            if name is None:
                continue
            if name in defs:
                ok, takes = _accepts(defs[name], want)
                if not ok:
                    sig = slot.signature()
                    problems.append(f"{where}.{key}: {name}() takes {takes} positional arguments, the slot passes {want}: {sig}")
            elif name not in assigned:
                problems.append(f"{where}.{key}: {row.source} defines no top-level {name!r}")
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(m.startswith(("kernelslot.verify", "kernelslot.abi.comparators")) for m in mods):
                problems.append(f"{where}.source: {row.source} imports the referee ({mods[0]}); a candidate never imports the referee")
    return problems


_MODULES: dict[str, ModuleType] = {}


def load_source_module(file: str) -> ModuleType:
    """Import a bundle source file once per process (its directory is importable meanwhile)."""
    if file in _MODULES:
        return _MODULES[file]
    path = Path(file)
    name = f"kernelslot_bundle_{hashlib.sha1(file.encode()).hexdigest()[:10]}_{path.stem}"
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


def resolve_callables(source: KernelSource) -> tuple[Callable, Callable | None]:
    """The entry and prepare callables a :class:`KernelSource` names."""
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
    return get(source.entry), get(source.prepare) if source.prepare else None
