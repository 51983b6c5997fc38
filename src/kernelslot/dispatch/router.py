"""Live routing: send each call to the single candidate variant whose domain covers it.

A :class:`SlotRouter` holds a slot's admitted variants and its trusted incumbent. Each call
comes with a :class:`CallDescriptor`; the variant whose capability domain matches — and, when
given, its verified envelope (``verify/envelope.py``: declared ∩ verified; a
:class:`~kernelslot.abi.Staircase` routes a call only below some run that verified it, in every
size field at once) — runs, and otherwise the incumbent does. If a variant raises, the
incumbent recomputes the call (the outputs are rewritten in full) and the failure is counted.
Receipts count ``fired`` (a variant was chosen), ``completed`` (it returned cleanly) and
``fallback`` (the incumbent ran), per variant, so a candidate that never runs earns no credit.

**Shadow checks.** A random sample of live calls (``shadow_rate``, drawn from an unseeded RNG)
is re-run by the incumbent on copies of the arguments after the variant returned; the slot's
comparator judges the variant's outputs against the incumbent's. A mismatch counts
``shadow_mismatch``, overwrites the outputs with the incumbent's, and disables the variant for
the rest of the router's life (its calls fall back), so a kernel that is honest only when it
recognises the referee gains nothing in serving. (Near-tie routing may differ honestly between
two correct kernels; the comparator's tolerance, not an admissible set, judges here.)
"""
from __future__ import annotations

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


@dataclass
class RouteCounters:
    fired: int = 0
    completed: int = 0
    fallback: int = 0
    shadowed: int = 0  # calls re-run by the incumbent on copies and compared
    shadow_mismatch: int = 0  # of those, calls whose outputs disagreed (the variant is then disabled)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RoutedPrepared:
    """What ``SlotRouter.prepare`` returns: every variant's prepared object, by variant name."""

    by_variant: dict[str, Any]


class SlotRouter:
    def __init__(self, defn: SlotDef, candidates: Sequence[Candidate], incumbent: Kernel | None = None, *,
                 verified: Mapping[str, Staircase | CapabilityDomain] | None = None, shadow_rate: float = 0.0):
        """``verified``: variant name -> its verified envelope (``envelope_domain(report.envelope[name])``;
        routes only inside it where given);
        ``shadow_rate``: the fraction of a variant's live calls shadow-checked against the incumbent."""
        if not 0.0 <= shadow_rate <= 1.0:
            raise ValueError(f"shadow_rate must be within [0, 1], got {shadow_rate}")
        for i, a in enumerate(candidates):
            for b in candidates[i + 1:]:
                if domains_overlap(a.domain, b.domain):
                    raise ValueError(f"{defn.name}: variants {a.name} and {b.name} have overlapping domains")
        self.defn = defn
        self.candidates = list(candidates)
        self.incumbent = incumbent or defn.incumbent
        self._callables = {c.name: resolve_kernel(c.kernel) for c in self.candidates}
        self._callables[INCUMBENT] = resolve_kernel(self.incumbent)
        self.counters: dict[str, RouteCounters] = {name: RouteCounters() for name in self._callables}
        self._prepared_pos = next((i for i, a in enumerate(defn.slot.args) if a.role is Role.PREPARED), None)
        self._lock = threading.Lock()
        self.verified = dict(verified or {})
        self.shadow_rate = shadow_rate
        self.disabled: set[str] = set()
        self._rng = random.SystemRandom()

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
                if self.shadow_rate and self._rng.random() < self.shadow_rate:
                    self._shadow(name, args)
                return
        with self._lock:
            self.counters[INCUMBENT].fallback += 1
            if name != INCUMBENT:
                self.counters[name].fallback += 1
        self._callables[INCUMBENT][0](*self._args_for(INCUMBENT, args))

    def _shadow(self, name: str, args: tuple) -> None:
        """Re-run the call with the incumbent on copies; on a mismatch, disable ``name`` and keep the incumbent's outputs."""
        copies = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        self._callables[INCUMBENT][0](*self._args_for(INCUMBENT, copies))
        problems = []
        for i, a in enumerate(self.defn.slot.args):
            if a.role is Role.OUTPUT and isinstance(args[i], torch.Tensor):
                verdict = self.defn.comparator_for(a.name).compare(args[i].detach().cpu(), copies[i].detach().cpu().float())
                if not verdict.passed:
                    problems.append(f"{a.name}: {verdict.describe()}")
        with self._lock:
            self.counters[name].shadowed += 1
            if problems:
                self.counters[name].shadow_mismatch += 1
                self.counters[name].errors.append("shadow check against the incumbent failed: " + "; ".join(problems))
                self.disabled.add(name)
                self.counters[name].fallback += 1
                self.counters[INCUMBENT].fallback += 1
        for i, a in enumerate(self.defn.slot.args):
            if problems and a.role is Role.OUTPUT and isinstance(args[i], torch.Tensor):
                args[i].copy_(copies[i])
