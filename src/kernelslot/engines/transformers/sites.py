"""What every install point shares: one slot's router over the installed candidates, with the
built-in as incumbent, and the per-variant call counters.

:class:`SlotState` is the state of one slot in one installation (norm, activation, attention and
block install points; the experts install point keeps one :class:`ExpertsState` per module
because each module has its own prepared weights). A site asks :meth:`SlotState.route` which
variant serves a call, :meth:`SlotState.count` records it, and :meth:`SlotState.call` runs it
through the :class:`~kernelslot.dispatch.SlotRouter`: with a bundle, that is the sandboxed
executor, the serving audits and the verified envelopes the installation passed in
(``serving``, ``verified``); the incumbent serves whatever no candidate covers.
"""
from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

from kernelslot.abi import CallDescriptor
from kernelslot.engines.transformers.experts import BUILTIN, MODEL_CODE, CallContext, CallCounters
from kernelslot.slots.base import Candidate


class SlotState:
    """The router (built-in incumbent, optional candidates) and call counters of one slot."""

    def __init__(self, slot: str, candidates: Sequence[Candidate] = (), context: Optional[CallContext] = None,
                 verified: Optional[dict] = None, serving: Optional[dict] = None, incumbent: Any = None):
        from kernelslot.dispatch import SlotRouter
        from kernelslot.slots import get_slot

        self.slot = slot
        self.router = SlotRouter(get_slot(slot), list(candidates), incumbent, verified=verified, **(serving or {}))
        self.context = context or CallContext()
        self.counters: dict[str, CallCounters] = {BUILTIN: CallCounters(), MODEL_CODE: CallCounters()}
        self._lock = threading.Lock()

    @property
    def decode(self) -> bool:
        return self.context.phase == "decode"

    def route(self, desc: CallDescriptor) -> str:
        """The variant that serves ``desc``: a candidate's name or :data:`BUILTIN`."""
        name = self.router.route(desc)
        return BUILTIN if name == "incumbent" else name

    def count(self, variant: str, calls: int = 1) -> None:
        with self._lock:
            r = self.counters.setdefault(variant, CallCounters())
            r.fired += calls
            r.fired_decode += calls * int(self.decode)

    def call(self, desc: CallDescriptor, *args: Any) -> None:
        """Count and run one slot call (router: candidate inside its envelope, else the incumbent)."""
        self.count(self.route(desc))
        self.router(desc, *args)

    def prepare(self, *args: Any):
        return self.router.prepare(*args)

    def counter_table(self) -> dict[str, CallCounters]:
        """Per variant; the candidates' ``completed``/``fallback``/errors are the router's."""
        table = {k: CallCounters(**{**v.__dict__, "errors": list(v.errors)}) for k, v in self.counters.items()}
        rc = self.router.counters
        table[BUILTIN].completed = rc["incumbent"].fallback - sum(x.fallback for n, x in rc.items() if n != "incumbent")
        for name, r in rc.items():
            if name != "incumbent" and name in table:
                table[name].completed, table[name].fallback, table[name].errors = r.completed, r.fallback, list(r.errors)
        return table
