"""Interpreted-Triton evidence: a bundle row's Triton kernels verified under Triton's interpreter on a CPU.

A row whose source imports triton (``Needs.interpret``, set by ``bundle/loader.py``) that this
machine cannot run on CUDA is, when triton is installed, verified on CPU tensors with
``TRITON_INTERPRET=1`` set in the process that imports its source, before the import
(``KernelSource.interpret``; triton chooses interpreter or compiler when a ``@triton.jit``
function is decorated), inside the same sandbox and worker as any candidate. Contract:

* the candidate that runs (:func:`interpreted`) is the row's, minus its ``arch`` predicates (no
  CUDA architecture is exercised), conjoined with the slot's interpreted sizes
  (:func:`interpreted_sizes`): fixed, drawn and boundary profiles beyond them are outside its
  domain, so the verified envelope stops there;
* every result and the slot report carry :data:`EVIDENCE`; timing is not run (a note says so) and
  CUDA-graph replay is skipped ("no CUDA device") as on any CPU run;
* a kernel the interpreter cannot run (an op it lacks, inline PTX, ``tl.extra.cuda`` intrinsics,
  a libdevice function it has no twin for), or that needs CUDA beyond its Triton kernels, makes the
  whole row *not run* with the interpreter's own message (:func:`interpreter_limit`), never a
  failure: the row, not the profile, so no kernel can trade the profiles it fails for "not run".
"""
from __future__ import annotations

import dataclasses
import re
import sysconfig
from pathlib import Path
from typing import Callable, Sequence

from kernelslot.abi import CapabilityDomain, domains_overlap
from kernelslot.abi.capability import Predicate
from kernelslot.isolation.runner import Runner
from kernelslot.slots.base import CUDA_PACKAGES, Candidate, Needs, SlotDef, importable
from kernelslot.verify.cases import describe, make_case
from kernelslot.verify.envelope import SIZE_FIELDS
from kernelslot.verify.options import Progress, VerifyOptions
from kernelslot.verify.verdict import FAIL, SlotReport

__all__ = ["EVIDENCE", "why_not_interpreted", "interpreted", "interpreted_sizes", "interpreter_limit",
           "verify_interpreted"]

EVIDENCE = "triton-interpreter on cpu; CUDA not run"
TRITON_EXTRA = "pip install 'kernelslot[triton]'"

# What an interpreted kernel raises where the interpreter, not the kernel, is the limit (triton 3.9):
# create_inline_asm / create_extern_elementwise raise NotImplementedError; a builtin it does not patch
# (tl.extra.cuda.globaltimer, smid, ...) asks for the compiler's semantic object.
_LACKS = ("not supported in interpreter mode", "`_semantic` argument must be provided outside of JIT functions")
_NEEDS_CUDA = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "No CUDA GPUs are available")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
# Frames that are not the candidate's: installed packages (triton, torch), kernelslot itself, the standard library.
_NOT_CANDIDATE = ("/site-packages/", "/dist-packages/", str(Path(__file__).resolve().parents[1]) + "/",
                  sysconfig.get_paths()["stdlib"] + "/")


def why_not_interpreted(needs: Needs, arch: str, native: str) -> str | None:
    """None when a candidate this machine cannot run (``native``: ``needs.unmet(arch)``) runs under
    Triton's interpreter here instead; else the not-run reason to report."""
    if not needs.interpret or arch != "cpu" or needs.blocked or not native.startswith("needs CUDA"):
        return native
    others = [p for p in needs.packages if p in CUDA_PACKAGES and p != "triton"]
    if others:
        return f"{native}; it imports {others[0]}, which Triton's interpreter cannot run"
    if not importable("triton"):
        return f"{native}, and triton is not installed to run its Triton kernels under the interpreter ({TRITON_EXTRA})"
    missing = [p for p in needs.packages if not importable(p)]
    return f"needs the {missing[0]} package; it is not installed here" if missing else None


def interpreted_sizes(defn: SlotDef) -> dict[str, int]:
    """The largest value of each size field a profile runs at under the interpreter: the slot's
    ``interpreted_sizes``, else, for each size field every fixed profile sets, its largest (seed 0)."""
    if defn.interpreted_sizes is not None:
        return dict(defn.interpreted_sizes)
    descs = [describe(defn, make_case(defn, p, 0, 0), p, "cpu") for p in defn.profiles]
    return {f: max(d.get(f) for d in descs) for f in SIZE_FIELDS if descs and all(isinstance(d.get(f), int) for d in descs)}


def interpreted(cand: Candidate, defn: SlotDef) -> Candidate:
    """``cand`` as it runs under the interpreter: its source imported with ``TRITON_INTERPRET=1``,
    its domain without ``arch`` and within the slot's interpreted sizes, needing nothing more."""
    source = dataclasses.replace(cand.kernel.origin(), interpret=True)  # loaded by the runner, never pre-imported
    caps = tuple(Predicate(f, "range", [0, v]) for f, v in interpreted_sizes(defn).items())
    kept = tuple(p for p in cand.domain.predicates if p.field != "arch")
    kernel = dataclasses.replace(cand.kernel, entry=None, prepare=None, source=source)
    return dataclasses.replace(cand, kernel=kernel, domain=CapabilityDomain(kept + caps), needs=Needs())


def _candidate_line(text: str) -> str:
    """``file.py:12 in fn: code`` of the first traceback frame in the candidate's own source, or ''."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m and not any(s in m.group(1) for s in _NOT_CANDIDATE):
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            return f"{m.group(1).rsplit('/', 1)[-1]}:{m.group(2)} in {m.group(3)}" + (f": {code}" if code else "")
    return ""


def interpreter_limit(message: str, libdevice: bool = False) -> str | None:
    """Why the interpreter could not run the kernel that failed with ``message`` (a traceback), in
    its own words and at the candidate's line; None when the failure is the kernel's. ``libdevice``:
    the kernel's source calls libdevice, whose functions are stubs returning None under the
    interpreter (the compiler binds them), so a None where a tensor belongs is the interpreter's."""
    where = _candidate_line(message)
    at = f" (at {where})" if where else ""
    if "InterpreterError" in message:
        stub = libdevice and "NoneType" in message
        if stub or any(s in message for s in _LACKS):
            last = next((ln.strip() for ln in reversed(message.splitlines()) if "InterpreterError" in ln), "")
            return (f"Triton's interpreter cannot run it: {last.split('InterpreterError: ', 1)[-1]}{at}"
                    + ("; its libdevice functions return None under the interpreter" if stub else ""))
    cuda = next((s for s in _NEEDS_CUDA if s in message), None)
    return f"it needs CUDA beyond its Triton kernels: {cuda}{at}" if cuda else None


def _calls_libdevice(cand: Candidate) -> bool:
    """Whether the candidate's source file names libdevice (read, never imported)."""
    file = cand.kernel.origin().file
    try:
        return file is not None and "libdevice" in Path(file).read_text(encoding="utf-8")
    except OSError:
        return False


def _groups(cands: Sequence[Candidate]) -> list[list[Candidate]]:
    """The candidates in groups of pairwise disjoint domains (each group is verified in one run)."""
    groups: list[list[Candidate]] = []
    for c in cands:
        home = next((g for g in groups if not any(domains_overlap(c.domain, o.domain) for o in g)), None)
        if home is None:
            groups.append([c])
        else:
            home.append(c)
    return groups


def _only_caps(skipped: str, caps: list[str]) -> bool:
    """Whether a profile was skipped for the interpreted sizes alone (its declared domain admits it)."""
    rest = skipped.removeprefix("outside declared domain: ")
    if rest == skipped:
        return False
    for cap in caps:
        rest = rest.replace(cap, "")
    return not rest.replace(",", "").strip()


Wing = Callable[..., SlotReport]  # (defn, candidates, opts, runner, progress, sessions) -> SlotReport (verify/referee.py)


def verify_interpreted(defn: SlotDef, cands: Sequence[Candidate], opts: VerifyOptions, runner: Runner | None,
                       progress: Progress | None, wing: Wing) -> list[SlotReport]:
    """Verify ``cands`` (rows :func:`why_not_interpreted` admits) under the interpreter through ``wing``:
    one report per group of disjoint interpreted domains, each carrying :data:`EVIDENCE`, or *not run*
    with :func:`interpreter_limit`'s reason where the interpreter could not run one of the group."""
    sizes = ", ".join(f"{f} <= {v}" for f, v in interpreted_sizes(defn).items())
    caps = [Predicate(f, "range", [0, v]).describe() for f, v in interpreted_sizes(defn).items()]
    reports = []
    for group in _groups([interpreted(c, defn) for c in cands]):
        report = wing(defn, group, dataclasses.replace(opts, time=False), runner, progress, None)
        names = ", ".join(c.name for c in group)
        libdevice = any(_calls_libdevice(c) for c in group)
        limit = next((lim for r in report.results for c in r.checks if c.status == FAIL
                      for lim in [interpreter_limit(c.message, libdevice)] if lim), None)
        if limit is None and all(r.skipped_reason for r in report.results) and any(
                _only_caps(r.skipped_reason, caps) for r in report.results):
            limit = f"none of its profiles fits the slot's interpreted sizes ({sizes}); verify it on a GPU"
        if limit is not None:
            report = SlotReport(defn.name, names, report.runner, report.device, not_run=limit)
        else:
            for r in report.results:
                r.evidence = "" if r.skipped_reason else EVIDENCE
            report.notes.append(f"{names}: run under Triton's interpreter up to the slot's interpreted sizes ({sizes}); "
                                "larger profiles are outside its domain here")
            if opts.time:
                report.notes.append(f"{names}: timing not run ({EVIDENCE})")
        report.evidence = EVIDENCE
        reports.append(report)
    return reports
