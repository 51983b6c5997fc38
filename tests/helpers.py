"""Small helpers shared by test modules."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

from kernelslot.slots.base import Kernel
from kernelslot.verify import SlotReport


def cheat_kernel(name: str) -> Kernel:
    """The kernel of ``tests/cheats/<name>.py``."""
    module = importlib.import_module(f"tests.cheats.{name}")
    return Kernel(module.entry, getattr(module, "prepare", None), name=f"cheat.{name}")


def declared(path: Path) -> dict:
    """The literal module-level constants of a cheat file (SLOT, EXPECT, ...), read without importing it:
    isolation and sandbox cheats act at import, which must only ever happen inside a worker."""
    found = {}
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return found


def failures(report: SlotReport) -> list:
    """A readable summary of every failed profile, for assertion messages."""
    return [(r.profile, r.dtype, [(c.name, c.message[:200]) for c in r.failures()]) for r in report.results if not r.passed]


def prepare_block(layer, path: str):
    """MoE block params for engine-parity tests. ``prepared``: the slot's prepare (native leaves where
    they apply); ``torch``: params on a fresh ExpertWeights object (no native layout), so the torch
    leaves run."""
    import dataclasses

    from kernelslot.kernels.moe_block import MoeBlockParams, prepare_moe_block

    if path == "torch":
        fresh = dataclasses.replace(layer, experts=dataclasses.replace(layer.experts))
        return MoeBlockParams(**{f.name: getattr(fresh, f.name) for f in dataclasses.fields(fresh)})
    return prepare_moe_block("moe_block", layer)
