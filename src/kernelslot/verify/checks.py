"""The referee's per-call checks, made from shared tensors and a runner's observation, and the
closing of a profile run's record (every check passed, failed, skipped with why, or not applicable).

Used by both wings (``verify/single/``, ``verify/collective/``); nothing here runs candidate code.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from kernelslot.abi import AllocatedOutput
from kernelslot.isolation.observe import TensorMeta, bits_equal
from kernelslot.isolation.runner import CallObservation
from kernelslot.slots.base import SlotDef
from kernelslot.verify.stores import store_hint
from kernelslot.verify.verdict import CHECKS, FAIL, PASS, SKIP, Check, ProfileResult, traceback_summary

__all__ = ["CALL_CHECKS", "SINGLE_DEVICE_CHECKS", "bits_equal", "snapshot", "check_inputs", "check_call", "not_applicable",
           "finish_checks"]

# Made on every call that ran (check_call and check_inputs).
CALL_CHECKS = (Check.RAISED, Check.RETURNED_VALUE, Check.INPUT_MUTATED, Check.OUTPUT_STORAGE_SWAPPED,
               Check.OUTPUT_ALIASES_INPUT, Check.POISON_LEFT, Check.OUT_OF_BOUNDS_WRITE, Check.RETAINED_TENSOR)
# Made by the single-device pipeline only (no collective slot declares a metamorphic relation: docs/referee.md, Known gaps).
SINGLE_DEVICE_CHECKS = (Check.METAMORPHIC,)


def snapshot(values: dict[str, Any]) -> dict[str, tuple[torch.Tensor, TensorMeta]]:
    """Clone every tensor (the referee's private copy) with its identity."""
    return {k: (v.detach().clone(), TensorMeta.of(v)) for k, v in values.items() if isinstance(v, torch.Tensor)}


def check_inputs(result: ProfileResult, inputs: dict[str, Any], snap: dict, label: str = "") -> bool:
    """Fail ``input_mutated`` when any input changed in value, storage, shape or stride."""
    problems = []
    for name, (ref, meta) in snap.items():
        t = inputs[name]
        now = TensorMeta.of(t)
        if (now.data_ptr, now.shape, now.stride, now.dtype) != (meta.data_ptr, meta.shape, meta.stride, meta.dtype):
            problems.append(f"{name} was rebound: {meta.changes(now)}")
        elif not bits_equal(t, ref):
            diff = (t.contiguous().view(torch.uint8) != ref.contiguous().view(torch.uint8)).sum().item()
            problems.append(f"{name}: {diff} byte(s) changed")
    if problems:
        result.record(Check.INPUT_MUTATED, FAIL, f"{label}" + "; ".join(problems))
        return False
    return True


def _ranges_overlap(a: TensorMeta, b: TensorMeta) -> bool:
    return a.storage_ptr < b.storage_ptr + b.storage_nbytes and b.storage_ptr < a.storage_ptr + a.storage_nbytes


def check_call(
    result: ProfileResult,
    obs: CallObservation,
    arg_names: Sequence[str],
    out_names: Sequence[str],
    outputs: dict[str, AllocatedOutput],
    out_meta_before: dict[str, TensorMeta],
    input_meta: dict[str, TensorMeta],
    label: str = "",
) -> bool:
    """Make the ABI checks of one call. Returns True when the outputs may be compared."""
    if obs.state_changed:
        result.record(Check.GLOBAL_STATE_CHANGED, FAIL, label + "; ".join(obs.state_changed))
    if obs.error:
        result.record(Check.RAISED, FAIL, label + traceback_summary(obs.error))
        return False
    if obs.returned is not None:
        result.record(Check.RETURNED_VALUE, FAIL, f"{label}entry returned {obs.returned}; it must write into the outputs and return None")
    ok = True
    meta_by_name = dict(zip(arg_names, obs.meta_after))
    rebound = [f"{n} was rebound: {m.changes(meta_by_name[n])}" for n, m in input_meta.items()
               if meta_by_name.get(n) is not None and m.changes(meta_by_name[n])]
    if rebound and result.check(Check.INPUT_MUTATED) is None:  # in a worker the referee's own tensor stays put
        result.record(Check.INPUT_MUTATED, FAIL, f"{label}inside the call: " + "; ".join(rebound))
    for name in out_names:
        after = meta_by_name.get(name)
        before = out_meta_before[name]
        if after is None:
            continue
        aliased = [i for i, m in input_meta.items() if _ranges_overlap(after, m)]
        aliased += [i for i, m in meta_by_name.items() if i in input_meta and m is not None and _ranges_overlap(after, m)]
        if aliased:
            result.record(Check.OUTPUT_ALIASES_INPUT, FAIL, f"{label}output {name} shares storage with input {sorted(set(aliased))[0]}")
            ok = False
        elif (after.data_ptr, after.shape, after.stride) != (before.data_ptr, before.shape, before.stride):
            result.record(
                Check.OUTPUT_STORAGE_SWAPPED, FAIL,
                f"{label}output {name} was rebound (ptr/shape/stride {before.shape}/{before.stride} -> {after.shape}/{after.stride}); "
                "write into the supplied tensor instead",
            )
            ok = False
    for name in out_names:
        alloc = outputs[name]
        view = alloc.view
        left = alloc.poison_mask()
        n_left = int(left.sum())
        outside = not alloc.canary_intact()
        hint = store_hint(name, alloc, input_meta) if n_left or outside else ""  # how it stored, for the author
        hint = f"; {hint}" if hint else ""
        if n_left:
            first = left.nonzero()[0].tolist()
            result.record(Check.POISON_LEFT, FAIL, f"{label}output {name}: {n_left} of {view.numel()} cells never written (first at {first}; "
                          f"poison {'finite sentinel' if alloc.poisoned_finite else 'NaN/int-min'}){hint}")
            ok = False
        if outside:
            result.record(Check.OUT_OF_BOUNDS_WRITE, FAIL, f"{label}output {name}: wrote outside its view (padding changed; "
                          f"honour the strides){hint}")
            ok = False
    if obs.retained:
        names = [arg_names[i] for i in obs.retained]
        result.record(Check.RETAINED_TENSOR, FAIL, f"{label}the candidate kept references to {', '.join(names)} after returning")
    return ok


def not_applicable(defn: SlotDef, check: str) -> bool:
    """Checks a slot never has: ``prepare``/``reprepare`` without prepare(), ``audit`` without one, ``metamorphic`` without relations."""
    return ((check in (Check.PREPARE, Check.REPREPARE) and not defn.slot.needs_prepare) or (check == Check.AUDIT and defn.audit is None)
            or (check == Check.METAMORPHIC and not defn.relations))


def finish_checks(result: ProfileResult, performed: set[str], defn: SlotDef, graph_why: str, *, why_not: str = "not reached",
                  omitted: frozenset[str] = frozenset(), unmade: Mapping[str, str] | None = None) -> ProfileResult:
    """Close ``result``: every check not failed is recorded as passed if it was ``performed``, else
    skipped with why — ``graph_why`` for graph replay, ``unmade[name]`` for a check this referee does
    not make, ``why_not`` otherwise — and left out where it does not apply (``not_applicable``, ``omitted``)."""
    failed = {c.name for c in result.failures()}
    for name in CHECKS:
        if name in failed:
            continue
        if name in performed:
            result.record(name, PASS)
        elif name == Check.GRAPH_REPLAY:
            result.record(name, SKIP, graph_why)
        elif not_applicable(defn, name) or name in omitted:
            continue
        elif unmade and name in unmade:
            result.record(name, SKIP, unmade[name])
        else:
            result.record(name, SKIP, why_not)
    return result
