"""Small helpers shared by test modules."""
from __future__ import annotations

import importlib

from kernelslot.slots.base import Kernel
from kernelslot.verify import SlotReport


def cheat_kernel(name: str) -> Kernel:
    """The kernel of ``tests/cheats/<name>.py``."""
    module = importlib.import_module(f"tests.cheats.{name}")
    return Kernel(module.entry, getattr(module, "prepare", None), name=f"cheat.{name}")


def failures(report: SlotReport) -> list:
    """A readable summary of every failed profile, for assertion messages."""
    return [(r.profile, r.dtype, [(c.name, c.message[:200]) for c in r.failures()]) for r in report.results if not r.passed]
