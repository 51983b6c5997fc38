"""Verdicts: what ran, which named checks (:class:`Check`) passed, with reasons and figures."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Check(str, Enum):
    """The named checks, in the order the referee makes them (docs/referee.md).

    A ``str`` enum: a member equals, hashes and formats as its name (``Check.REPLAY == "replay"``),
    so stored reports and JSON keep plain strings.
    """

    PREPARE = "prepare"  # prepare() ran, returned, and left its inputs unchanged
    RAISED = "raised"  # entry raised / crashed / timed out
    RETURNED_VALUE = "returned_value"  # entry returned something other than None
    INPUT_MUTATED = "input_mutated"  # an input changed bit-exactly, or its storage/shape/stride changed
    OUTPUT_STORAGE_SWAPPED = "output_storage_swapped"  # an output's storage, shape or stride changed
    OUTPUT_ALIASES_INPUT = "output_aliases_input"  # an output shares storage with an input
    POISON_LEFT = "poison_left"  # an output cell still holds the poison
    OUT_OF_BOUNDS_WRITE = "out_of_bounds_write"  # the canary around an output changed
    RETAINED_TENSOR = "retained_tensor"  # the candidate kept a reference to an argument's storage
    GLOBAL_STATE_CHANGED = "global_state_changed"  # candidate code left process-wide numeric state changed (FTZ, threads, precision flags, ...)
    COMPARE = "compare"  # the slot's comparator against the trusted reference
    AUDIT = "audit"  # the slot's hard validity audits
    REPLAY = "replay"  # fresh inputs at the same addresses, re-poisoned, compared again
    REPREPARE = "reprepare"  # weights reloaded in place (same storages, new values), prepare() again, the call compared
    DETERMINISM = "determinism"  # the previous call repeated on poisoned scratch: outputs bitwise equal
    METAMORPHIC = "metamorphic"  # a relation the slot's semantics guarantee (tokens permuted, weights scaled) holds between two calls
    GRAPH_REPLAY = "graph_replay"  # the same under a captured CUDA graph (CUDA, graph_safe entries)
    TIME_IMPOSSIBLE = "time_impossible"  # --time: a timed call faster than its physics floor (verify/single/roofline.py)

    __str__ = str.__str__
    __format__ = str.__format__


CHECKS = tuple(Check)

PASS, FAIL, SKIP = "pass", "fail", "skip"
NOT_RUN = "not run"  # this machine cannot run the candidate (no CUDA, a missing package): no verdict on it

_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_REFEREE = ("/kernelslot/verify/", "/kernelslot/isolation/", "/kernelslot/dispatch/")


def candidate_frame(text: str) -> str | None:
    """``file.py:12 in func`` of the innermost traceback frame in ``text`` outside the referee, if any."""
    frames = [m for m in (_FRAME.match(line) for line in text.splitlines()) if m and not any(r in m.group(1) for r in _REFEREE)]
    if not frames:
        return None
    return f"{frames[-1].group(1).rsplit('/', 1)[-1]}:{frames[-1].group(2)} in {frames[-1].group(3)}"


def traceback_summary(text: str) -> str:
    """``text`` led by one line with its last line (the exception type and message, or a runner's
    ``[cause]`` line) and the candidate's innermost frame, so the one-line table view shows them:
    ``"prepare() raised: ValueError: bad (at kernel.py:12 in prepare)"``, then the full text."""
    lines = text.strip().splitlines()
    if not lines:
        return text
    where = candidate_frame(text)
    lead = lines[0].rstrip()
    head = lead.rstrip(":") + ": " if len(lines) > 1 and lead.endswith(":") and not lead.startswith("Traceback") else ""
    return f"{head}{lines[-1].strip()}" + (f" (at {where})" if where else "") + "\n" + text


def verdict_text(status: str, evidence: str) -> str:
    """``status`` with the evidence it rests on, where that is not the device itself (a pass or a
    fail; a *not run* says its own reason)."""
    return f"{status} ({evidence})" if evidence and status in (PASS, FAIL) else status


def run_evidence(slots: list[tuple[str, str]]) -> str:
    """The evidence of a run from the (slot, evidence) of each slot judged (passed or failed): the
    one they all share, else each slot's that has one (``norm.rmsnorm: triton-interpreter ...``)."""
    if len({e for _, e in slots}) == 1:
        return slots[0][1]
    return "; ".join(f"{slot}: {e}" for slot, e in slots if e)


@dataclass
class CheckResult:
    name: str
    status: str
    message: str = ""


@dataclass
class ProfileResult:
    slot: str
    profile: str
    dtype: str
    model: str
    seed: int
    kernel: str
    checks: list[CheckResult] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    skipped_reason: str = ""
    drawn: dict[str, Any] = field(default_factory=dict)  # a drawn profile's record: seed, index, base, dims
    evidence: str = ""  # what the verdict rests on where not the device itself (verify/interpreted.py EVIDENCE)

    @property
    def passed(self) -> bool:
        return not self.skipped_reason and all(c.status != FAIL for c in self.checks)

    @property
    def status(self) -> str:
        if self.skipped_reason:
            return SKIP
        return PASS if self.passed else FAIL

    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == FAIL]

    def first_failure(self) -> CheckResult | None:
        fails = self.failures()
        return fails[0] if fails else None

    def record(self, name: str, status: str, message: str = "") -> None:
        self.checks.append(CheckResult(str(name), status, message))  # a plain str, also for a Check

    def check(self, name: str) -> CheckResult | None:
        for c in self.checks:
            if c.name == name:
                return c
        return None


@dataclass
class SlotReport:
    slot: str
    kernel: str
    runner: str
    device: str
    results: list[ProfileResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # failures that stopped the slot (e.g. load errors)
    not_run: str = ""  # why no candidate could run on this machine (Needs.unmet); then nothing ran
    envelope: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant -> verified staircase (verify/envelope.py)
    notes: list[str] = field(default_factory=list)  # not failures: e.g. an envelope clipped for memory
    evidence: str = ""  # what the verdict rests on where not the device itself, e.g. "triton-interpreter on cpu; CUDA not run"

    @property
    def passed(self) -> bool:
        ran = [r for r in self.results if not r.skipped_reason]
        return not self.not_run and not self.errors and bool(ran) and all(r.passed for r in ran)

    @property
    def status(self) -> str:
        """pass, fail or not run (never a failure of the candidate)."""
        return NOT_RUN if self.not_run else PASS if self.passed else FAIL

    @property
    def verdict(self) -> str:
        """The status and the evidence it rests on: ``pass (triton-interpreter on cpu; CUDA not run)``."""
        return verdict_text(self.status, self.evidence)

    def failed_checks(self) -> set[str]:
        return {c.name for r in self.results for c in r.failures()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        d["status"] = self.status
        d["verdict"] = self.verdict
        for r, rd in zip(self.results, d["results"]):
            rd["status"] = r.status
        return d
