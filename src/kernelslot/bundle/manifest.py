"""Bundle manifests (``manifest.toml``), in the format of kernel-slot arenas.

::

    bundle_id = "my-kernels"
    abi_version = "cacheon-op-abi-v0"
    [competition]                  # optional
    target = "MiniMax-M3"
    mode = "local"
    [[ops]]
    slot = "activation.silu_and_mul"
    source = "kernels/act.py"      # inside the bundle
    entry = "silu_and_mul"
    variant = "small"              # required when a slot repeats; variant domains may not overlap
    prepare = "prepare"            # required exactly when the slot has a prepare step
    dtypes = ["bfloat16"]          # -> domain predicate dtype one_of (bf16, fp16, ... accepted)
    architectures = ["cpu"]        # -> domain predicate arch one_of ("cpu", "sm80", "sm_90a", ...)
    metadata = "meta.json"         # optional JSON: model binding and arena eligibility keys
    graph_safe = true              # routing declaration for CUDA-graph capture
    [ops.domain]                   # predicates over CallDescriptor fields
    num_tokens = { range = [1, 64] }

An override row names ``base_kernel`` and ``override_point`` instead of a prepare: its entry
(or ``<entry>_ref``) is composed into a built-in base (``kernels/moe_overrides.py``). The
row's effective domain (``bundle/domain.py``) conjoins manifest and metadata. Keys the arena
uses that kernelslot does not admit (:data:`REJECTED_KEYS`) are refused with the reason.

Every malformed manifest raises :class:`ManifestError` with one line naming the file, the key
and what is allowed.
"""
from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelslot.abi import CapabilityDomain, canonical_arch, domains_overlap
from kernelslot.bundle.direct.spec import DIRECT_KEYS, PROVIDERS, DirectError, is_direct_row, parse_direct
from kernelslot.bundle.domain import DomainError, effective_domain
from kernelslot.kernels.moe_overrides import BASES, find_base
from kernelslot.slots import CATALOG

ABI_VERSION = "cacheon-op-abi-v0"
TOP_KEYS = ("bundle_id", "abi_version", "competition", "ops")
COMPETITION_KEYS = ("target", "mode")
OP_KEYS = ("slot", "source", "entry", "variant", "prepare", "dtypes", "architectures", "metadata", "domain", "graph_safe",
           "base_kernel", "override_point")
# Keys the arena's bundles use that kernelslot does not admit, and why (never a bare "unknown key").
REJECTED_KEYS = {
    "setup": "a host callback run at engine start-up, outside the slot ABI (a candidate owns only the computation "
             "behind its entry and prepare); remove it",
    "dep_patches": "dependency patches are not admitted: a bundle cannot change the engine or its dependencies",
}  # aot_exports / artifact_resources / native_sources / cuda_sources: the direct-artifact form (bundle/direct)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ManifestError(ValueError):
    """A malformed bundle: the message is one line naming file, key and what is allowed."""


@dataclass(frozen=True)
class OpRow:
    index: int
    slot: str
    source: str
    entry: str
    variant: str | None
    prepare: str | None
    dtypes: tuple[str, ...]
    architectures: tuple[str, ...]
    metadata: str | None
    model: str  # the model profile the row is bound to ("generic" when its metadata names none)
    domain: CapabilityDomain  # the effective domain (bundle/domain.py)
    graph_safe: bool
    direct: Any = None  # a DirectOp (kernelslot.bundle.direct) for a direct-artifact row: no source/entry
    base_kernel: str | None = None  # override submissions: the built-in base and its override point
    override_point: str | None = None

    @property
    def label(self) -> str:
        return f"{self.slot}" + (f"[{self.variant}]" if self.variant else "")


@dataclass(frozen=True)
class Manifest:
    root: Path
    path: Path
    bundle_id: str
    abi_version: str
    competition: dict[str, str]
    ops: tuple[OpRow, ...]


def _err(path: Path, key: str, problem: str) -> ManifestError:
    return ManifestError(f"{path}: {key}: {problem}")


def _inside(root: Path, rel: Any, path: Path, key: str) -> Path:
    if not isinstance(rel, str) or not rel:
        raise _err(path, key, f"must be a relative path string inside the bundle, got {rel!r}")
    target = (root / rel).resolve()
    if Path(rel).is_absolute() or not target.is_relative_to(root.resolve()):
        raise _err(path, key, f"{rel!r} leaves the bundle; paths must stay inside {root}")
    if not target.is_file():
        raise _err(path, key, f"{rel!r} does not exist in the bundle")
    return target


def _rejected(path: Path, where: str, keys: Any) -> None:
    for key in keys:
        if key in REJECTED_KEYS:
            raise _err(path, f"{where}{key}", f"not admitted: {REJECTED_KEYS[key]}")


def _metadata(root: Path, path: Path, where: str, rel: Any) -> dict:
    meta_path = _inside(root, rel, path, f"{where}.metadata")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _err(path, f"{where}.metadata", f"{rel} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise _err(path, f"{where}.metadata", f"{rel} must hold a JSON object")
    return meta


def _parse_op(root: Path, path: Path, i: int, row: Any) -> OpRow:
    where = f"ops[{i}]"
    if not isinstance(row, dict):
        raise _err(path, where, "each [[ops]] entry must be a table")
    _rejected(path, f"{where}.", row)
    unknown = sorted(set(row) - set(OP_KEYS) - set(DIRECT_KEYS))
    if unknown:
        raise _err(path, f"{where}.{unknown[0]}", f"unknown key; allowed: {', '.join(OP_KEYS + DIRECT_KEYS)}")
    for key in ("slot",) if is_direct_row(row) else ("slot", "source", "entry"):
        if key not in row:
            raise _err(path, f"{where}.{key}", "required key is missing")
    slot = row["slot"]
    if slot not in CATALOG:
        raise _err(path, f"{where}.slot", f"unknown slot {slot!r}; known: {', '.join(sorted(CATALOG))}")
    direct = _parse_direct(root, path, where, row, slot) if is_direct_row(row) else None
    if direct is None:
        _inside(root, row["source"], path, f"{where}.source")
        if not str(row["source"]).endswith(".py"):
            raise _err(path, f"{where}.source", "must be a Python source file (.py); native artifacts use the direct-artifact form")
    for key in ("entry", "prepare"):
        if key in row and (not isinstance(row[key], str) or not _IDENT.match(row[key])):
            raise _err(path, f"{where}.{key}", f"must be a Python identifier, got {row[key]!r}")
    base, point = _override(path, where, row, slot)
    needs_prepare = CATALOG[slot].slot.needs_prepare and base is None
    if needs_prepare and "prepare" not in row and direct is None:
        raise _err(path, f"{where}.prepare", f"slot {slot} has a prepare step ({CATALOG[slot].slot.signature()}); name the function")
    if not needs_prepare and "prepare" in row:
        why = "an override uses its base's prepare" if base else f"slot {slot} has no prepare step"
        raise _err(path, f"{where}.prepare", f"{why}; remove the key")
    variant = row.get("variant")
    if variant is not None and (not isinstance(variant, str) or not variant):
        raise _err(path, f"{where}.variant", f"must be a non-empty string, got {variant!r}")
    if not isinstance(row.get("graph_safe", False), bool):
        raise _err(path, f"{where}.graph_safe", f"must be true or false, got {row['graph_safe']!r}")
    if direct is not None and PROVIDERS[direct.provider].device == "cpu":  # runs on the CPU only
        if "architectures" in row and set(map(canonical_arch, row["architectures"])) - {"cpu"}:
            raise _err(path, f"{where}.architectures", f"a {direct.provider} artifact runs on the CPU only; allowed: cpu")
        row = {**row, "architectures": ["cpu"]}
    if not isinstance(row.get("domain", {}), dict):
        raise _err(path, f"{where}.domain", "must be a table of {field = {predicate = value}}")
    meta = _metadata(root, path, where, row["metadata"]) if "metadata" in row else {}
    try:
        eff = effective_domain(row, meta, slot, where, override=base is not None)
    except DomainError as exc:
        raise _err(path, exc.key, str(exc)) from None
    return OpRow(i, slot, row.get("source", ""), row.get("entry", ""), variant, row.get("prepare"), eff.dtypes,
                 eff.archs, row.get("metadata"), eff.model, eff.domain, eff.graph_safe, direct=direct, base_kernel=base,
                 override_point=point)


def _parse_direct(root: Path, path: Path, where: str, row: dict, slot: str) -> Any:
    """The direct-artifact form of a row, parsed by kernelslot.bundle.direct (docs/direct-artifacts.md)."""
    try:
        return parse_direct(row, CATALOG[slot].slot, root)
    except DirectError as exc:
        raise _err(path, f"{where}.{exc.key}", exc.problem) from None


def _override(path: Path, where: str, row: dict, slot: str) -> tuple[str | None, str | None]:
    """An override row's (base, point), checked against the built-in bases; (None, None) otherwise."""
    if "base_kernel" not in row and "override_point" not in row:
        return None, None
    for key in ("base_kernel", "override_point"):
        if not isinstance(row.get(key), str):
            raise _err(path, f"{where}.{key}", "an override row names both base_kernel and override_point (strings)")
    base = find_base(row["base_kernel"])
    if base is None or base.slot != slot:
        known = ", ".join(f"{b.name} ({b.slot}; alias {', '.join(b.aliases)})" for b in BASES.values())
        raise _err(path, f"{where}.base_kernel", f"{row['base_kernel']!r} is not a built-in base of {slot}; known: {known}")
    if row["override_point"] not in base.points:
        raise _err(path, f"{where}.override_point", f"{row['override_point']!r} is not an override point of "
                                                    f"{base.name}; known: {', '.join(base.points)}")
    return base.name, row["override_point"]


def load_manifest(bundle: str | Path) -> Manifest:
    """Parse and statically validate ``BUNDLE/manifest.toml`` (no candidate code runs)."""
    root = Path(bundle)
    path = root / "manifest.toml" if root.is_dir() else root
    root = path.parent
    if not path.is_file():
        raise ManifestError(f"{path}: no manifest.toml found; a bundle is a directory holding manifest.toml and its sources")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text (byte {exc.start}); save the manifest as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path}: not valid TOML ({exc})") from None
    _rejected(path, "", data)
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise _err(path, unknown[0], f"unknown top-level key; allowed: {', '.join(TOP_KEYS)}")
    for key in ("bundle_id", "abi_version"):
        if key not in data:
            raise _err(path, key, "required key is missing")
        if not isinstance(data[key], str):
            raise _err(path, key, f"must be a string, got {data[key]!r}")
        if not data[key]:
            raise _err(path, key, "must not be empty")
    if data["abi_version"] != ABI_VERSION:
        raise _err(path, "abi_version", f"{data['abi_version']!r} is not supported; allowed: {ABI_VERSION!r}")
    competition = data.get("competition", {})
    if not isinstance(competition, dict):
        raise _err(path, "competition", "must be a table with target and mode")
    for key, value in competition.items():
        if key not in COMPETITION_KEYS:
            raise _err(path, f"competition.{key}", f"unknown key; allowed: {', '.join(COMPETITION_KEYS)}")
        if not isinstance(value, str):
            raise _err(path, f"competition.{key}", f"must be a string, got {value!r}")
    ops = data.get("ops")
    if not isinstance(ops, list) or not ops:
        raise _err(path, "ops", "at least one [[ops]] table is required")
    rows = tuple(_parse_op(root, path, i, row) for i, row in enumerate(ops))
    _check_variants(path, rows)
    return Manifest(root.resolve(), path, data["bundle_id"], data["abi_version"], dict(competition), rows)


def _check_variants(path: Path, rows: tuple[OpRow, ...]) -> None:
    by_slot: dict[str, list[OpRow]] = {}
    for r in rows:
        by_slot.setdefault(r.slot, []).append(r)
    for slot, group in by_slot.items():
        if len(group) == 1:
            continue
        for r in group:
            if r.variant is None:
                raise _err(path, f"ops[{r.index}].variant", f"slot {slot} appears {len(group)} times; every row needs a variant name")
        names = [r.variant for r in group]
        if len(set(names)) != len(names):
            raise _err(path, f"ops[{group[0].index}].variant", f"variant names for {slot} repeat: {names}")
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if domains_overlap(a.domain, b.domain):
                    raise _err(path, f"ops[{b.index}].domain",
                               f"variants {a.variant!r} and {b.variant!r} of {slot} overlap ({a.domain.describe()} / "
                               f"{b.domain.describe()}); make their domains disjoint")
