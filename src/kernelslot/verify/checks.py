"""The referee's per-call checks, made from shared tensors and a runner's observation."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from kernelslot.abi import AllocatedOutput
from kernelslot.verify.report import FAIL, ProfileResult, traceback_summary
from kernelslot.verify.runner import CallObservation, TensorMeta


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (NaN payloads and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


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
        result.record("input_mutated", FAIL, f"{label}" + "; ".join(problems))
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
        result.record("global_state_changed", FAIL, label + "; ".join(obs.state_changed))
    if obs.error:
        result.record("raised", FAIL, label + traceback_summary(obs.error))
        return False
    if obs.returned is not None:
        result.record("returned_value", FAIL, f"{label}entry returned {obs.returned}; it must write into the outputs and return None")
    ok = True
    meta_by_name = dict(zip(arg_names, obs.meta_after))
    rebound = [f"{n} was rebound: {m.changes(meta_by_name[n])}" for n, m in input_meta.items()
               if meta_by_name.get(n) is not None and m.changes(meta_by_name[n])]
    if rebound and result.check("input_mutated") is None:  # in a worker the referee's own tensor stays put
        result.record("input_mutated", FAIL, f"{label}inside the call: " + "; ".join(rebound))
    for name in out_names:
        after = meta_by_name.get(name)
        before = out_meta_before[name]
        if after is None:
            continue
        aliased = [i for i, m in input_meta.items() if _ranges_overlap(after, m)]
        aliased += [i for i, m in meta_by_name.items() if i in input_meta and m is not None and _ranges_overlap(after, m)]
        if aliased:
            result.record("output_aliases_input", FAIL, f"{label}output {name} shares storage with input {sorted(set(aliased))[0]}")
            ok = False
        elif (after.data_ptr, after.shape, after.stride) != (before.data_ptr, before.shape, before.stride):
            result.record(
                "output_storage_swapped", FAIL,
                f"{label}output {name} was rebound (ptr/shape/stride {before.shape}/{before.stride} -> {after.shape}/{after.stride}); "
                "write into the supplied tensor instead",
            )
            ok = False
    for name in out_names:
        alloc = outputs[name]
        view = alloc.view
        left = alloc.poison_mask()
        n_left = int(left.sum())
        if n_left:
            first = left.nonzero()[0].tolist()
            result.record("poison_left", FAIL, f"{label}output {name}: {n_left} of {view.numel()} cells never written (first at {first}; "
                          f"poison {'finite sentinel' if alloc.poisoned_finite else 'NaN/int-min'})")
            ok = False
        if not alloc.canary_intact():
            result.record("out_of_bounds_write", FAIL, f"{label}output {name}: wrote outside its view (padding changed; honour the strides)")
            ok = False
    if obs.retained:
        names = [arg_names[i] for i in obs.retained]
        result.record("retained_tensor", FAIL, f"{label}the candidate kept references to {', '.join(names)} after returning")
    return ok
