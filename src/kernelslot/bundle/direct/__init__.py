"""Sealed direct artifacts (DESIGN.md §2 bundle/, docs/direct-artifacts.md).

A direct-artifact ``[[ops]]`` row ships native sources instead of a Python callable. The
referee parses it (:mod:`.spec`, :mod:`.expr`), builds and seals it (:mod:`.seal`), and the
process that runs candidates reopens the seal, admits the object (:mod:`.elf`, :mod:`.admit`,
:mod:`.native`, :mod:`.cuda`) and launches it itself (:mod:`.launcher`). To the referee's
pipeline the row is an ordinary candidate whose ``entry`` is that launcher.
"""
from __future__ import annotations

from pathlib import Path

from kernelslot.bundle.direct.admit import AdmissionError, admit_static
from kernelslot.bundle.direct.seal import Seal, SealError, ToolchainMissing, build_and_seal, open_seal
from kernelslot.bundle.direct.spec import PROVIDERS, DirectOp

__all__ = ["ToolchainMissing", "AdmissionError", "admit_static", "SealError", "build_and_seal", "open_seal", "not_run_reason",
           "describe_seal", "evidence_problem", "open_sealed"]


def not_run_reason(op: DirectOp, device: str = "cpu") -> str | None:
    """Why this machine cannot run ``op`` on ``device`` (the "not run" verdict), or ``None``."""
    provider = PROVIDERS[op.provider]
    if provider.device == "cuda":
        from kernelslot.bundle.direct.cuda import unavailable_reason

        return unavailable_reason() or (None if device == "cuda" else f"{provider.name} runs with --device cuda")
    return None if device == "cpu" else f"{provider.name} runs on the CPU (--device cpu)"


def evidence_problem(evidence: list[str] | tuple[str, ...]) -> str | None:
    from kernelslot.bundle.direct.launcher import evidence_problem as judge

    return judge(evidence)


def open_sealed(handle: str):  # noqa: ANN201 - DirectArtifact, imported lazily (it imports torch)
    from kernelslot.bundle.direct.launcher import open_sealed as op

    return op(handle)


def describe_seal(op: DirectOp, seal: Seal, bundle_root: Path | None = None) -> list[str]:
    """The lines ``kernelslot scan`` prints for a direct row: exports, bindings, launches, inventory, seal."""
    lines = []
    for e in op.exports:
        spec = ", ".join(f"{x.text} == {v!r}" for x, v in e.specializes)
        lines.append(f"    export {e.name}: role {e.role}, plan {e.plan}, step {e.step}" + (f", when {spec}" if spec else ""))
        for j, b in enumerate(e.bindings):
            lines.append(f"      binding {j}: {b.describe()}" + (f" [{b.width} B]" if b.width else ""))
        for f in e.prelaunch:
            lines.append(f"      prelaunch: fill {f.target} with {f.value:g}")
        for j, ln in enumerate(e.launches):
            lines.append(f"      launch {j}: {ln.kernel}({', '.join(str(p) for p in ln.params)})")
    for r in op.resources:
        lines.append(f"    resource {r.name}: {r.dtype}[{', '.join(x.text for x in r.shape)}] align {r.alignment} ({r.lifetime})")
    observed = {k["name"]: k for k in seal.index.get("inventory", [])}
    for k in op.kernels():
        seen = observed.get(k.name)
        got = "not found in the object" if seen is None else (
            f"object {seen.get('params', '?')}" + (f" ({seen['problem']})" if seen.get("problem") else ""))
        lines.append(f"    kernel {k.name}: declared {list(k.params)}; {got}")
    for name in sorted(set(observed) - {k.name for k in op.kernels()}):
        lines.append(f"    kernel {name}: exported by the object but not declared")
    idx = seal.index
    lines.append(f"    seal {seal.path}  index sha256 {seal.digest}")
    lines.append(f"      {len(idx['files'])} file(s): " + ", ".join(f"{f['path']} ({f['size']} B, {f['sha256'][:12]})" for f in idx["files"]))
    lines.append(f"      toolchain: {'; '.join(f'{k}: {v}' for k, v in idx['toolchain'].items() if v)}; network: {idx['network']}")
    lines.append(f"      flags: {' '.join(idx['flags'])}")
    return lines
