"""Live routing: send each call to the single candidate variant whose domain covers it.

A :class:`SlotRouter` holds a slot's admitted variants and its trusted incumbent. Each call
comes with a :class:`CallDescriptor`; the variant whose capability domain matches runs, and
outside every domain the incumbent does. If a variant raises, the incumbent recomputes the
call (the outputs are rewritten in full) and the failure is counted. Receipts count
``fired`` (a variant was chosen), ``completed`` (it returned cleanly) and ``fallback`` (the
incumbent ran), per variant, so a candidate that never runs earns no credit.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from kernelslot.abi import CallDescriptor, Role, domains_overlap
from kernelslot.slots.base import Candidate, Kernel, SlotDef
from kernelslot.verify.runner import resolve_kernel

INCUMBENT = "incumbent"


@dataclass
class Receipts:
    fired: int = 0
    completed: int = 0
    fallback: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RoutedPrepared:
    """What ``SlotRouter.prepare`` returns: every variant's prepared object, by variant name."""

    by_variant: dict[str, Any]


class SlotRouter:
    def __init__(self, defn: SlotDef, candidates: Sequence[Candidate], incumbent: Kernel | None = None):
        for i, a in enumerate(candidates):
            for b in candidates[i + 1:]:
                if domains_overlap(a.domain, b.domain):
                    raise ValueError(f"{defn.name}: variants {a.name} and {b.name} have overlapping domains")
        self.defn = defn
        self.candidates = list(candidates)
        self.incumbent = incumbent or defn.incumbent
        self._callables = {c.name: resolve_kernel(c.kernel) for c in self.candidates}
        self._callables[INCUMBENT] = resolve_kernel(self.incumbent)
        self.receipts: dict[str, Receipts] = {name: Receipts() for name in self._callables}
        self._prepared_pos = next((i for i, a in enumerate(defn.slot.args) if a.role is Role.PREPARED), None)
        self._lock = threading.Lock()

    def route(self, desc: CallDescriptor) -> str:
        """The name of the variant that serves ``desc`` (or :data:`INCUMBENT`)."""
        for c in self.candidates:
            if c.domain.matches(desc):
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
                self.receipts[name].fired += 1
            try:
                self._callables[name][0](*self._args_for(name, args))
            except Exception as exc:  # the incumbent rewrites every output below
                with self._lock:
                    self.receipts[name].errors.append(f"{type(exc).__name__}: {exc}")
            else:
                with self._lock:
                    self.receipts[name].completed += 1
                return
        with self._lock:
            self.receipts[INCUMBENT].fallback += 1
            if name != INCUMBENT:
                self.receipts[name].fallback += 1
        self._callables[INCUMBENT][0](*self._args_for(INCUMBENT, args))
