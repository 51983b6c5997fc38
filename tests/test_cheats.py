"""Every cheat kernel under tests/cheats/ must fail the referee with a check that names it."""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest
import torch

import tests.cheats as cheats_pkg
from kernelslot.abi import CapabilityDomain
from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.verify import VerifyOptions, verify_slot
from tests.helpers import declared

# Cheats that need processes of their own (collective ranks, isolation) set SKIP_GENERIC or use
# EXPECT instead of CATCHES; tests/verify/test_collective.py and test_worker.py run those.
# SKIP_GENERIC is read from the source, before any import: some of those act at import (set FTZ, patch the referee).
CHEATS = sorted(
    m.name for m in pkgutil.iter_modules(cheats_pkg.__path__)
    if not m.name.startswith(("isolation_", "sandbox_"))  # they act at import: only ever loaded inside a worker
    and not declared(Path(cheats_pkg.__path__[0]) / f"{m.name}.py").get("SKIP_GENERIC", False)
    and hasattr(importlib.import_module(f"tests.cheats.{m.name}"), "CATCHES")
)
OPTS = VerifyOptions(dtypes=(torch.float32, torch.bfloat16), draws=0)  # the fixed catalog; drawn profiles: tests/slots/test_structural.py


@pytest.mark.parametrize("name", CHEATS)
def test_cheat_fails_with_named_check(name):
    mod = importlib.import_module(f"tests.cheats.{name}")
    defn = get_slot(mod.SLOT)
    kernel = Kernel(mod.entry, getattr(mod, "prepare", None), name=f"cheat.{name}")
    # a cheat may declare the domain and model a bundle would (to dodge profiles outside them)
    domain = CapabilityDomain.from_mapping(getattr(mod, "DOMAIN", {}))
    # OPTIONS: VerifyOptions fields the cheat needs (e.g. time=True, a bundle's extra_mean, a pinned plan_seed)
    opts = dataclasses.replace(OPTS, model=getattr(mod, "MODEL", None),
                               dtypes=None if hasattr(mod, "DOMAIN") else OPTS.dtypes, **getattr(mod, "OPTIONS", {}))
    report = verify_slot(defn, Candidate(kernel, domain, model=getattr(mod, "MODEL", None)), opts)
    assert not report.passed, f"cheat {name} passed the referee"
    caught = report.failed_checks()
    assert caught & set(mod.CATCHES), f"cheat {name} failed only {sorted(caught)}, expected one of {sorted(mod.CATCHES)}"


@pytest.mark.parametrize("slot", sorted({importlib.import_module(f"tests.cheats.{n}").SLOT for n in CHEATS}))
def test_honest_incumbent_passes_same_options(slot):
    defn = get_slot(slot)
    assert verify_slot(defn, defn.builtin_candidates(), OPTS).passed
