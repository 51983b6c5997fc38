"""Parsing the direct-artifact form: every malformed field is rejected with its key and what is allowed."""
from __future__ import annotations

import copy

import pytest

from kernelslot.bundle.direct.spec import DirectError, parse_direct
from kernelslot.slots import CATALOG

SILU = CATALOG["activation.silu_and_mul"].slot
MOE = CATALOG["moe.fused_experts"].slot


def _row() -> dict:
    return {
        "slot": "activation.silu_and_mul",
        "native_sources": ["k.c"],
        "aot_exports": [{
            "provider": "native.elf.v1", "name": "silu",
            "bindings": [
                {"source": "input.x", "kind": "pointer", "projection": "host_ptr"},
                {"source": "output.out", "kind": "pointer", "projection": "host_ptr"},
                {"kind": "scalar", "type": "i64", "expr": "numel(out) // shape(out, -1)"},
            ],
            "device_plan": {"kernels": [{"name": "k", "params": [8, 8, 8]}],
                            "launches": [{"kernel": "k", "params": [0, 1, 2]}]},
        }],
    }


def _parse(row: dict, slot=SILU):
    return parse_direct(row, slot, None)


def test_valid_row_parses_with_its_inventory_and_digest():
    op = _parse(_row())
    assert op.provider == "native.elf.v1" and [k.name for k in op.kernels()] == ["k"]
    assert op.exports[0].role == "run" and op.exports[0].bindings[2].width == 8
    assert op.digest == _parse(_row()).digest  # canonical
    other = _row()
    other["aot_exports"][0]["bindings"][2]["expr"] = "numel(x)"
    assert _parse(other).digest != op.digest


def _mutated(path: str, value, slot=SILU) -> str:
    row = _row()
    target = row
    keys = path.split("/")
    for k in keys[:-1]:
        target = target[int(k)] if k.isdigit() else target[k]
    last = keys[-1]
    if value is KeyError:
        del target[last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    with pytest.raises(DirectError) as exc:
        _parse(row, slot)
    return str(exc.value)


E = "aot_exports/0/"


@pytest.mark.parametrize("path, value, reason", [
    (E + "provider", "python.v1", "allowed: native.elf.v1, cuda.cubin.v1"),
    (E + "role", "warmup", "allowed: init, prepare, reset, run, destroy"),
    (E + "bindings/2", {"kind": "group_handle"}, "fails closed"),
    (E + "bindings/2", {"kind": "pointer", "source": "group", "projection": "host_ptr"}, "fail closed"),
    (E + "bindings/0/projection", "device_ptr", "native.elf.v1 launches take host_ptr"),
    (E + "bindings/0/source", "input.weights", "not available to a run export"),
    (E + "bindings/0/source", "env.HOME", "unknown source"),
    (E + "bindings/2", {"kind": "scalar", "type": "i32", "expr": "numel(out)"}, "is 4 bytes but kernel k declares parameter 2 as 8"),
    (E + "bindings/2", {"kind": "scalar", "type": "f32", "expr": "1"}, "expressions are integer-valued"),
    (E + "bindings/2", {"kind": "stream", "source": "stream.current"}, "has no streams"),
    (E + "bindings/2", {"kind": "tma_descriptor", "source": "input.x", "box": [8]}, "CUDA tensor map"),
    (E + "bindings/2", {"kind": "packed_struct", "size": 16, "fields": [
        {"offset": 0, "type": "i64", "expr": "1"}, {"offset": 4, "type": "i32", "expr": "2"}]}, "overlaps field 0"),
    (E + "bindings/2", {"kind": "packed_struct", "size": 8, "fields": [{"offset": 2, "type": "i32", "expr": "1"}]}, "4-aligned"),
    (E + "bindings/2", {"kind": "scalar", "type": "i64", "expr": "shape(w, 0)"}, "no pointer binding of this export projects"),
    (E + "bindings/2", {"kind": "scalar", "type": "i64", "expr": "eps"}, "not a scalar binding of this export"),
    (E + "bindings/2", {"kind": "scalar", "type": "i64", "expr": "numel(out)", "callback": "f"}, "callback: unknown key"),
    (E + "bindings", [{"kind": "scalar", "type": "i64", "expr": "1"}] * 65, "at most 64"),
    (E + "device_plan/kernels", [{"name": "z", "params": [8, 8, 8]}, {"name": "a", "params": []}], "sorted and unique"),
    (E + "device_plan/launches/0/params", [0, 1], "2 parameter(s) for kernel k, which declares 3"),
    (E + "device_plan/launches/0/params", [0, 1, 7], "must be an integer in [0, 2]"),
    (E + "device_plan/launches/0/kernel", "other", "not in this export's kernels"),
    (E + "device_plan/launches/0/grid", ["1"], "no grid, block, shared memory or stream"),
    (E + "device_plan/launches", [{"kernel": "k", "params": [0, 1, 2]}] * 257, "at most 256"),
    (E + "device_plan/launches", [], "non-empty list"),
    (E + "prelaunch", [{"op": "fill", "target": "input.x", "value": 0}], "not 'input.x' (inputs are read-only)"),
    (E + "prelaunch", [{"op": "memcpy", "target": "output.out"}], "allowed: fill"),
    (E + "specializes", {"dtype(x)": 4}, "dtype() equals a dtype name"),
    (E + "specializes", {"data_ptr(x)": 4}, "outside the expression vocabulary"),
    ("native_sources", ["../escape.c"], "relative path inside the bundle"),
    ("native_sources", ["k.py"], "ending in .c"),
    ("native_sources", ["k.h"], "at least one C/C++ translation unit"),
    ("cuda_sources", ["k.cu"], "its sources go in `native_sources`"),
    ("entry", "silu", "runs no Python"),
])
def test_malformed_fields_are_rejected(path, value, reason):
    message = _mutated(path, value)
    assert reason in message, message


def test_init_cannot_see_the_call_and_run_must_exist():
    row = _row()
    row["aot_exports"][0]["role"] = "init"
    with pytest.raises(DirectError, match="not available to an init export; it may bind only state"):
        _parse(row)
    row = _row()
    row["artifact_resources"] = [{"name": "state.s", "dtype": "float32", "shape": [4]}]
    row["aot_exports"][0]["role"] = "init"
    row["aot_exports"][0]["bindings"] = [{"source": "state.s", "kind": "pointer", "projection": "host_ptr"}] * 3
    row["aot_exports"][0]["device_plan"]["kernels"][0]["params"] = [8, 8, 8]
    with pytest.raises(DirectError, match="no export has role = \"run\""):
        _parse(row)


def test_resources_respect_their_lifetimes():
    row = _row()
    row["artifact_resources"] = [{"name": "workspace.tmp", "dtype": "float32", "shape": ["numel(x)"]}]
    row["aot_exports"][0]["bindings"][2] = {"source": "workspace.tmp", "kind": "pointer", "projection": "host_ptr"}
    op = _parse(row)
    assert op.resources[0].lifetime == "call"
    row["artifact_resources"] = [{"name": "state.tmp", "dtype": "float32", "shape": ["numel(x)"]}]
    row["aot_exports"][0]["bindings"][2]["source"] = "state.tmp"
    with pytest.raises(DirectError, match="constants only"):
        _parse(row)
    row["artifact_resources"] = [{"name": "scratch", "dtype": "float32", "shape": [4]}]
    with pytest.raises(DirectError, match="must be workspace.NAME"):
        _parse(row)
    row["artifact_resources"] = [{"name": "workspace.tmp", "dtype": "float32", "shape": [4], "alignment": 48}]
    with pytest.raises(DirectError, match="power of two"):
        _parse(row)


def test_prepare_slots_need_a_prepare_export_that_produces_prepared_storage():
    row = {"native_sources": ["m.c"], "aot_exports": [{
        "provider": "native.elf.v1", "name": "run",
        "bindings": [{"source": "input.x", "kind": "pointer", "projection": "host_ptr"}],
        "device_plan": {"kernels": [{"name": "k", "params": [8]}], "launches": [{"kernel": "k", "params": [0]}]}}]}
    with pytest.raises(DirectError, match="has a prepare step"):
        _parse(row, MOE)
    row["artifact_resources"] = [{"name": "prepared.w", "dtype": "float32", "shape": ["numel(w13)"]}]
    row["aot_exports"].append({
        "provider": "native.elf.v1", "name": "pack", "role": "prepare",
        "bindings": [{"source": "input.w13", "kind": "pointer", "projection": "host_ptr"}],
        "device_plan": {"kernels": [{"name": "k", "params": [8]}], "launches": [{"kernel": "k", "params": [0]}]}})
    with pytest.raises(DirectError, match="must be produced by a prepare export and consumed by a run export"):
        _parse(row, MOE)
    good = copy.deepcopy(row)
    good["aot_exports"][0]["bindings"].append({"source": "prepared.w", "kind": "pointer", "projection": "host_ptr"})
    good["aot_exports"][1]["bindings"].append({"source": "prepared.w", "kind": "pointer", "projection": "host_ptr"})
    good["aot_exports"][1]["device_plan"] = {"kernels": [{"name": "k", "params": [8]}], "launches": [{"kernel": "k", "params": [1]}]}
    assert [e.role for e in _parse(good, MOE).exports] == ["run", "prepare"]


def test_cuda_rows_need_grid_block_and_a_declared_stream():
    row = _row()
    row.pop("native_sources")
    row["cuda_sources"] = ["k.cu"]
    e = row["aot_exports"][0]
    e["provider"] = "cuda.cubin.v1"
    for b in e["bindings"][:2]:
        b["projection"] = "device_ptr"
    with pytest.raises(DirectError, match="needs `grid` and `block`"):
        _parse(row)
    e["device_plan"]["launches"][0].update(grid=["cdiv(numel(out), 256)"], block=[256], stream=2)
    with pytest.raises(DirectError, match="not a stream binding; there is no ambient stream"):
        _parse(row)
    e["bindings"].append({"kind": "stream", "source": "stream.current"})
    e["device_plan"]["launches"][0]["stream"] = 3
    e["bindings"].append({"kind": "fast_divmod", "form": "cutlass", "expr": "shape(out, -1)"})
    op = _parse(row)
    assert op.provider == "cuda.cubin.v1" and op.exports[0].bindings[4].width == 12
