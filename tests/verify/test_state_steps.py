"""The call plan's state steps (issue 18 items 3, 4, 7; verify/plan.py): re-prepare after an
in-place weight reload, a repeat on poisoned scratch, metamorphic relations. Each cheat of those
classes passes when its step is left out of the plan and fails by its check when it is in."""
from __future__ import annotations

import importlib

import pytest
import torch

from kernelslot.slots import CATALOG, Candidate, Kernel, get_slot
from kernelslot.slots.base import KernelSource
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.single import pipeline
from kernelslot.verify.plan import Planner
from kernelslot.isolation.scratch import poisoned_scratch
from kernelslot.isolation.worker import WorkerRunner
from tests.isolation.test_worker import CHEATS_DIR

# cheat: (the check that catches it, the profile it runs on)
STEPS = {"prepared_cache_by_weight_address": ("reprepare", "ragged_batch_nonpow2"),
         "reads_uninitialised_scratch": ("determinism", "ragged_rows_nonpow2"),
         "metamorphic_order_blind_cache": ("metamorphic", "ragged_rows_nonpow2"),
         "metamorphic_calibrated_weight_range": ("metamorphic", "ragged_batch_nonpow2")}


def test_state_steps_are_planned_only_where_asked():
    planner = Planner(plan_seed=3)
    for _ in range(20):
        plan = planner.plan(reprepare=True, repeat=True, relations=2)
        kinds = [c.refill for c in plan.calls]
        assert kinds[0] == "first" and kinds.count("reprepare") == 1 and kinds.count("repeat") == 1
        assert sorted(c.relation for c in plan.calls if c.refill == "relation") == [0, 1]
        assert all(c.scratch for c in plan.calls if c.refill == "repeat")
        bare = planner.plan()  # what the collective referee consumes: none of the state steps, no poisoned scratch
        assert not {c.refill for c in bare.calls} & {"reprepare", "repeat", "relation"} and not any(c.scratch for c in bare.calls)


def _run(name: str, monkeypatch, with_step: bool):
    mod = importlib.import_module(f"tests.cheats.{name}")
    check, profile = STEPS[name]
    if not with_step:
        monkeypatch.setattr(pipeline, "plan_for", lambda defn, planner: planner.plan())
    # a pinned plan: the scale factor a metamorphic step draws is random (c > 1 half the time)
    opts = VerifyOptions(model=getattr(mod, "MODEL", None), dtypes=(torch.float32,), profiles=(profile,), plan_seed=5)
    cand = Candidate(Kernel(mod.entry, getattr(mod, "prepare", None), name=name), model=getattr(mod, "MODEL", None))
    return verify_slot(get_slot(mod.SLOT), cand, opts), check


@pytest.mark.parametrize("name", sorted(set(STEPS) - {"reads_uninitialised_scratch"}))  # its luck needs a fresh process: below
def test_each_cheat_passes_without_its_step_and_fails_by_it_with(name, monkeypatch):
    report, check = _run(name, monkeypatch, with_step=False)
    assert report.passed, [c.message[:200] for r in report.results for c in r.failures()]
    monkeypatch.undo()
    report, check = _run(name, monkeypatch, with_step=True)
    assert not report.passed and check in report.failed_checks(), sorted(report.failed_checks())


def test_reprepare_writes_new_values_into_the_same_storages():
    seen = []

    def prepare(w13, w2):
        seen.append((w13.data_ptr(), w2.data_ptr(), w13.clone()))
        return (w13.clone(), w2.clone())

    def entry(x, topk_ids, topk_weights, prepared, out):
        from kernelslot.kernels import moe

        moe.fused_experts_silu(x, topk_ids, topk_weights, moe.prepare(*prepared), out)

    opts = VerifyOptions(dtypes=(torch.float32,), profiles=("ragged_batch_nonpow2",))
    report = verify_slot(get_slot("moe.fused_experts"), Candidate(Kernel(entry, prepare, name="copies")), opts)
    assert report.passed, report.results[0].failures()
    assert len(seen) == 2 and seen[0][:2] == seen[1][:2] and not torch.equal(seen[0][2], seen[1][2])


@pytest.mark.parametrize("name", ["reads_uninitialised_scratch", "prepared_cache_by_weight_address"])
def test_in_a_fresh_worker_passes_without_its_step_and_fails_by_it_with(name, monkeypatch):
    """The scratch is poisoned, and the weights reloaded, in the worker's own process."""
    mod = importlib.import_module(f"tests.cheats.{name}")
    source = KernelSource(entry="entry", prepare="prepare" if hasattr(mod, "prepare") else None, file=str(CHEATS_DIR / f"{name}.py"))
    cand = Candidate(Kernel(None, None, name=name, source=source), model=getattr(mod, "MODEL", None))
    check, profile = STEPS[name]
    opts = VerifyOptions(model=getattr(mod, "MODEL", None), dtypes=(torch.float32,), profiles=(profile,), plan_seed=5,
                         extra_mean=0.0)
    for with_step in (False, True):
        if not with_step:
            monkeypatch.setattr(pipeline, "plan_for", lambda defn, planner: planner.plan())
        with WorkerRunner(call_timeout_s=30.0) as worker:
            report = verify_slot(get_slot(mod.SLOT), cand, opts, runner=worker)
        monkeypatch.undo()
        if with_step:
            assert check in report.failed_checks() <= {check, "replay"}, sorted(report.failed_checks())  # the call is compared too
        else:
            assert report.passed, [c.message[:200] for r in report.results for c in r.failures()]


def test_poisoned_scratch_is_what_allocations_get():
    fill = torch.utils.deterministic.fill_uninitialized_memory, torch.are_deterministic_algorithms_enabled()
    with poisoned_scratch():
        assert torch.isnan(torch.empty(8 << 20)).all()  # fresh pages too, through torch
        assert (torch.empty(16, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
    assert (torch.utils.deterministic.fill_uninitialized_memory, torch.are_deterministic_algorithms_enabled()) == fill


def test_declared_relations_name_live_inputs_and_outputs():
    for name, defn in CATALOG.items():
        for relation in defn.relations:
            case = defn.make_case(defn.profiles[0], torch.Generator().manual_seed(0))
            moved = getattr(relation, "inputs", None) or (relation.input,)
            assert set(moved) <= set(case.live_names()), (name, relation)
            assert set(relation.outputs) <= set(case.outputs), (name, relation)


def test_every_slot_states_what_prepared_state_may_persist():
    from kernelslot.slots.contract import render_contract, slot_contract

    for name, defn in CATALOG.items():
        contract = slot_contract(defn)
        text = render_contract(contract)
        assert "Prepared state" in text and contract["prepared_state"] in text, name
        assert ("reloads the weights in place" in contract["prepared_state"]) == defn.slot.needs_prepare, name
        assert all(r.describe() in text for r in defn.relations), name
