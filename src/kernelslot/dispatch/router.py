"""Live routing: send each call to the single candidate variant whose domain covers it.

A :class:`SlotRouter` holds a slot's admitted variants and its trusted incumbent. Each call
comes with a :class:`CallDescriptor`; the variant whose capability domain matches — and, when
given, its verified envelope (``verify/envelope.py``: declared ∩ verified; a
:class:`~kernelslot.abi.Staircase` routes a call only below some run that verified it, in every
size field at once) — runs, and otherwise the incumbent does. If a variant raises, the
incumbent recomputes the call (the outputs are rewritten in full) and the failure is counted.
Receipts count ``fired`` (a variant was chosen), ``completed`` (it returned cleanly) and
``fallback`` (the incumbent ran), per variant, so a candidate that never runs earns no credit.

**Where candidates run.** With an ``executor`` (:class:`kernelslot.isolation.executor.Executor`,
what :func:`~kernelslot.engines.transformers.install` uses for a bundle) every variant's ``prepare``
and ``entry`` run in sandboxed workers like verification's; without one they run in this process
(the built-ins, or a bundle installed with ``trust="in-process"``, which can reach everything below).

**Audits** (``audits=True``; on for installed bundles). Per variant and call signature (tensor
shapes and dtypes, scalar values) the router audits call numbers 1, 2, 4, 8, ... and, besides, a
random ``audit_floor`` share of the rest (an unseeded RNG, in this process): before the call the
inputs are copied, after it the incumbent recomputes the call on those copies and the slot's
comparator judges the variant's outputs against the incumbent's; with an executor the worker
threads' floating-point control state is also read from outside (ptrace) and compared with the
previous reading. A kernel honest for its first N calls of a signature is caught at the first power
of two above N, for every N; one wrong on a fraction f of calls at random is caught after about
``1/(f·audit_floor)`` calls. A mismatch disables the variant for every later call (the incumbent
serves them), overwrites the audited call's outputs with the incumbent's, is recorded
(:class:`AuditMismatch`: slot, variant, signature, call number, comparator statistic) in the
variant's counters, and is logged once. Outputs of unaudited calls between two audits are the
variant's own: the schedule bounds how long a dishonest kernel serves, not that it never does.
Cost: one incumbent call per audited call, log2(N) + audit_floor·N of N calls.
"""
from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from kernelslot.abi import CallDescriptor, CapabilityDomain, Role, Staircase, domains_overlap
import kernelslot.isolation  # noqa: F401 - serving loads the modules a sandboxed worker holds: sys.modules tells neither apart (docs/threat-model.md, "Identity")
from kernelslot.bundle.loader import resolve_kernel
from kernelslot.slots.base import Candidate, Kernel, SlotDef

INCUMBENT = "incumbent"
log = logging.getLogger("kernelslot.dispatch")


@dataclass(frozen=True)
class AuditMismatch:
    """One audited call whose outputs the incumbent did not reproduce (or that changed numeric state)."""

    slot: str
    variant: str
    signature: str
    call: int  # the call number within that variant and signature (1-based)
    statistic: str  # the comparator's verdict, or the numeric-state change

    def describe(self) -> str:
        return f"{self.slot} variant {self.variant}, call {self.call} of signature {self.signature}: {self.statistic}"


@dataclass
class RouteCounters:
    fired: int = 0
    completed: int = 0
    fallback: int = 0
    audited: int = 0  # calls re-run by the incumbent on copies of their inputs and compared
    audit_mismatch: int = 0  # of those, calls that disagreed (the variant is then disabled)
    errors: list[str] = field(default_factory=list)
    mismatches: list[AuditMismatch] = field(default_factory=list)


@dataclass(frozen=True)
class RoutedPrepared:
    """What ``SlotRouter.prepare`` returns: every variant's prepared object, by variant name."""

    by_variant: dict[str, Any]


class SlotRouter:
    def __init__(self, defn: SlotDef, candidates: Sequence[Candidate], incumbent: Kernel | None = None, *,
                 verified: Mapping[str, Staircase | CapabilityDomain] | None = None, executor: Any = None,
                 audits: bool = False, audit_floor: float = 0.0):
        """``verified``: variant name -> its verified envelope (``envelope_domain(report.envelope[name])``;
        routes only inside it where given); ``executor``: run the variants there (see the module
        docstring); ``audits``: audit calls 1, 2, 4, ... of each signature, and ``audit_floor`` of the rest."""
        if not 0.0 <= audit_floor <= 1.0:
            raise ValueError(f"audit_floor must be within [0, 1], got {audit_floor}")
        for i, a in enumerate(candidates):
            for b in candidates[i + 1:]:
                if domains_overlap(a.domain, b.domain):
                    raise ValueError(f"{defn.name}: variants {a.name} and {b.name} have overlapping domains")
        self.defn = defn
        self.candidates = list(candidates)
        self.incumbent = incumbent or defn.incumbent
        self.executor = executor
        self._outputs = tuple(i for i, a in enumerate(defn.slot.args) if a.role is Role.OUTPUT)
        self._callables = {c.name: self._served(c.kernel) if executor is not None else resolve_kernel(c.kernel)
                           for c in self.candidates}
        self._callables[INCUMBENT] = resolve_kernel(self.incumbent)
        self.counters: dict[str, RouteCounters] = {name: RouteCounters() for name in self._callables}
        self._prepared_pos = next((i for i, a in enumerate(defn.slot.args) if a.role is Role.PREPARED), None)
        self._lock = threading.Lock()
        self.verified = dict(verified or {})
        self.audits, self.audit_floor = audits, audit_floor
        self._calls: dict[tuple, int] = {}  # (variant, signature) -> calls so far
        self.disabled: set[str] = set()
        self._rng = random.SystemRandom()

    def _served(self, kernel: Kernel) -> tuple:
        """``kernel``'s entry and prepare as calls into the executor."""
        executor, outputs = self.executor, self._outputs

        def entry(*args: Any) -> None:
            executor.call(kernel, args, outputs)

        def prepare(*args: Any) -> Any:
            return executor.prepare(kernel, args)

        return entry, prepare

    def route(self, desc: CallDescriptor) -> str:
        """The name of the variant that serves ``desc`` (or :data:`INCUMBENT`)."""
        for c in self.candidates:
            if c.domain.matches(desc) and c.name not in self.disabled and (
                    c.name not in self.verified or self.verified[c.name].matches(desc)):
                return c.name
        return INCUMBENT

    def prepare(self, *prepare_args: Any) -> RoutedPrepared:
        """Run every variant's prepare (and the incumbent's) once, at load time."""
        out = {}
        for name, (_, prepare) in self._callables.items():
            if prepare is None:
                raise ValueError(f"{self.defn.name}: {name} has no prepare() but the slot needs one")
            out[name] = prepare(*prepare_args)
        return RoutedPrepared(out)

    def _args_for(self, name: str, args: tuple) -> tuple:
        if self._prepared_pos is None:
            return args
        routed = args[self._prepared_pos]
        if not isinstance(routed, RoutedPrepared):
            raise TypeError(f"{self.defn.name}: pass the object returned by SlotRouter.prepare() as the prepared argument")
        args = list(args)
        args[self._prepared_pos] = routed.by_variant[name]
        return tuple(args)

    def __call__(self, desc: CallDescriptor, *args: Any) -> None:
        name = self.route(desc)
        if name != INCUMBENT:
            audit = self._audit_plan(name, args)
            with self._lock:
                self.counters[name].fired += 1
            try:
                self._callables[name][0](*self._args_for(name, args))
            except Exception as exc:  # the incumbent rewrites every output below
                with self._lock:
                    self.counters[name].errors.append(f"{type(exc).__name__}: {exc}")
            else:
                with self._lock:
                    self.counters[name].completed += 1
                if audit is not None:
                    self._audit(name, args, *audit)
                return
        with self._lock:
            self.counters[INCUMBENT].fallback += 1
            if name != INCUMBENT:
                self.counters[name].fallback += 1
        self._callables[INCUMBENT][0](*self._args_for(INCUMBENT, args))

    @staticmethod
    def signature(args: Sequence[Any]) -> str:
        """What an audit counts calls by: tensor shapes and dtypes, and scalar values."""
        parts = []
        for a in args:
            if isinstance(a, torch.Tensor):
                parts.append(f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}")
            elif isinstance(a, (bool, int, float, str)) or a is None:
                parts.append(repr(a))
        return "(" + ", ".join(parts) + ")"

    def _audit_plan(self, name: str, args: tuple) -> tuple | None:
        """None for an unaudited call; else (signature, call number, copies of the arguments) taken
        before the variant runs (outputs as fresh tensors for the incumbent)."""
        if not self.audits:
            return None
        sig = self.signature(args)
        with self._lock:
            n = self._calls[(name, sig)] = self._calls.get((name, sig), 0) + 1
        if n & (n - 1) and not (self.audit_floor and self._rng.random() < self.audit_floor):
            return None
        copies = tuple((torch.empty_like(a) if i in self._outputs else a.clone()) if isinstance(a, torch.Tensor) else a
                       for i, a in enumerate(args))
        return sig, n, copies

    def _audit(self, name: str, args: tuple, sig: str, n: int, copies: tuple) -> None:
        """The incumbent on the copies; on a mismatch, disable ``name`` and keep the incumbent's outputs."""
        self._callables[INCUMBENT][0](*self._args_for(INCUMBENT, copies))
        problems = []
        for i in self._outputs:
            a = self.defn.slot.args[i]
            if isinstance(args[i], torch.Tensor):
                verdict = self.defn.comparator_for(a.name).compare(args[i].detach().cpu(), copies[i].detach().cpu().float())
                if not verdict.passed:
                    problems.append(f"{a.name}: {verdict.describe()}")
        if self.executor is not None:
            kernel = next(c.kernel for c in self.candidates if c.name == name)
            problems += [f"numeric state changed in the executor worker: {line}"
                         for line in self.executor.numeric_state_changes(kernel)]
        with self._lock:
            self.counters[name].audited += 1
            if problems:
                mismatch = AuditMismatch(self.defn.name, name, sig, n, "; ".join(problems))
                self.counters[name].audit_mismatch += 1
                self.counters[name].mismatches.append(mismatch)
                self.counters[name].errors.append("audit against the incumbent failed: " + mismatch.statistic)
                self.disabled.add(name)
                self.counters[name].fallback += 1
                self.counters[INCUMBENT].fallback += 1
        if problems:
            log.warning("kernelslot: audit mismatch, %s; the variant is disabled (the incumbent serves it)",
                        mismatch.describe())
            for i in self._outputs:
                if isinstance(args[i], torch.Tensor):
                    args[i].copy_(copies[i])
