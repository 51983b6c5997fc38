"""The referee's launcher: lifecycle, packed structs, FastDivmod, specialisation and receipts."""
from __future__ import annotations

import random
import struct
import textwrap

import pytest
import torch

from kernelslot.abi import OutputSpec, allocate_output
from kernelslot.bundle import load_bundle
from kernelslot.bundle.direct import open_sealed, evidence_problem
from kernelslot.bundle.direct.launcher import LaunchError
from kernelslot.bundle.direct.native import fast_divmod
from kernelslot.slots import get_slot
from kernelslot.slots.base import Kernel, KernelSource
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.isolation.runner import InProcessRunner

SILU = get_slot("activation.silu_and_mul")


def _silu(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d].double()) * x[..., d:].double()


def test_the_admitted_artifact_writes_strided_outputs_and_leaves_receipts(activation_bundle):
    art = open_sealed(next(iter(activation_bundle.seals.values())).handle)
    x = torch.randn(2, 5, 24)
    out = allocate_output(OutputSpec((2, 5, 12), torch.float32), torch.device("cpu"))
    assert art(x, out.view) is None
    torch.testing.assert_close(out.view.double(), _silu(x), rtol=1e-6, atol=1e-6)
    assert out.canary_intact()
    receipts = art.take_evidence()
    assert [r.split(":")[0] for r in receipts] == ["aot_loaded", "aot_invoked", "completed"]
    assert receipts[1] == "aot_invoked:silu_and_mul_f32" and evidence_problem(receipts) is None
    with pytest.raises(LaunchError, match="no export of role run, step 0 match this call"):
        art(x.double(), torch.empty(2, 5, 12, dtype=torch.float64))


@pytest.mark.parametrize("receipts, reason", [
    ([], "no aot_loaded"),
    (["aot_invoked:x", "completed"], "no aot_loaded"),
    (["aot_loaded:ab", "completed"], "never launched"),
    (["aot_loaded:ab", "aot_invoked:x"], "no completed"),
    (["aot_loaded:ab", "aot_invoked:x", "fallback", "completed"], "disqualifies"),
])
def test_receipts_are_evidence(receipts, reason):
    assert reason in evidence_problem(receipts)


def test_a_sealed_source_served_by_anything_but_the_artifact_fails():
    def impostor(x, out):
        out.copy_(_silu(x))

    kernel = Kernel(impostor, name="impostor", source=KernelSource("run", sealed="/nowhere@0"))
    obs = InProcessRunner().call(kernel, [torch.randn(3, 8), torch.empty(3, 4)])
    assert obs.cause == "no_aot_evidence" and "no aot_loaded receipt" in obs.error


def test_fast_divmod_matches_integer_division():
    rng = random.Random(0)
    for d in [1, 2, 3, 7, 12, 64, 1000, 65537, (1 << 31) - 1] + [rng.randrange(1, 1 << 31) for _ in range(50)]:
        div, mul, shift = struct.unpack("<iII", fast_divmod(d))
        assert div == d
        for n in [0, 1, d - 1, d, d + 1, (1 << 31) - 1] + [rng.randrange(0, 1 << 31) for _ in range(20)]:
            q = n if d == 1 else ((n * mul) >> 32) >> shift
            assert q == n // d, (n, d)


KITCHEN_C = textwrap.dedent("""
    #include <math.h>
    #include <stdint.h>
    #define KS_EXPORT __attribute__((visibility("default")))
    struct args { const float *x; float *out; int64_t d; int64_t xs; int64_t os; int32_t rows; int32_t pad; };
    struct divmod { int32_t divisor; uint32_t multiplier; uint32_t shift_right; };

    KS_EXPORT void ks_init(float *scale, int64_t n) { for (int64_t i = 0; i < n; i++) scale[i] = 1.0f; }
    /* flat index -> (row, column) through the referee-built FastDivmod; times state.scale (set by init) */
    KS_EXPORT void ks_silu_packed(struct args a, struct divmod dm, const float *scale) {
        for (int64_t i = 0; i < (int64_t)a.rows * a.d; i++) {
            uint32_t r = dm.divisor == 1 ? (uint32_t)i : (uint32_t)(((uint64_t)i * dm.multiplier) >> 32) >> dm.shift_right;
            int64_t j = i - (int64_t)r * a.d;
            double g = a.x[r * a.xs + j], u = a.x[r * a.xs + a.d + j];
            a.out[r * a.os + j] = (float)(g / (1.0 + exp(-g)) * u) * scale[0];
        }
    }
    KS_EXPORT void ks_nothing(float *out) { (void)out; }  /* a run that does no work */
""")

KITCHEN_TOML = textwrap.dedent("""
    bundle_id = "kitchen"
    abi_version = "cacheon-op-abi-v0"
    [[ops]]
    slot = "activation.silu_and_mul"
    dtypes = ["float32", "bfloat16"]
    native_sources = ["k.c"]
    [[ops.artifact_resources]]
    name = "state.scale"
    dtype = "float32"
    shape = [4]
    [[ops.aot_exports]]
    provider = "native.elf.v1"
    name = "init_scale"
    role = "init"
    bindings = [ { source = "state.scale", kind = "pointer", projection = "host_ptr" },
                 { kind = "scalar", type = "i64", expr = "numel(state.scale)" } ]
    [ops.aot_exports.device_plan]
    kernels = [ { name = "ks_init", params = [8, 8] } ]
    launches = [ { kernel = "ks_init", params = [0, 1] } ]
    [[ops.aot_exports]]
    provider = "native.elf.v1"
    name = "packed"
    specializes = { "dtype(x)" = "float32", "rank(x)" = 2 }
    bindings = [
      { source = "input.x", kind = "pointer", projection = "host_ptr" },
      { source = "output.out", kind = "pointer", projection = "host_ptr" },
      { kind = "packed_struct", size = 48, fields = [
          { offset = 0, type = "ptr", binding = 0 }, { offset = 8, type = "ptr", binding = 1 },
          { offset = 16, type = "i64", expr = "shape(out, -1)" }, { offset = 24, type = "i64", expr = "stride(x, 0)" },
          { offset = 32, type = "i64", expr = "stride(out, 0)" }, { offset = 40, type = "i32", expr = "shape(out, 0)" } ] },
      { kind = "fast_divmod", form = "cutlass", expr = "shape(out, -1)" },
      { source = "state.scale", kind = "pointer", projection = "host_ptr" },
    ]
    [ops.aot_exports.device_plan]
    kernels = [ { name = "ks_silu_packed", params = [48, 12, 8] } ]
    launches = [ { kernel = "ks_silu_packed", params = [2, 3, 4] } ]
    [[ops.aot_exports]]
    provider = "native.elf.v1"
    name = "lazy"
    specializes = { "dtype(x)" = "bfloat16" }
    bindings = [ { source = "input.x", kind = "pointer", projection = "host_ptr" },
                 { source = "output.out", kind = "pointer", projection = "host_ptr" } ]
    [ops.aot_exports.device_plan]
    kernels = [ { name = "ks_nothing", params = [8] } ]
    launches = [ { kernel = "ks_nothing", params = [1] } ]
""")


def test_packed_struct_fast_divmod_and_init_state_through_the_pipeline(fresh_seal_root, tmp_path):
    (tmp_path / "k.c").write_text(KITCHEN_C)
    (tmp_path / "manifest.toml").write_text(KITCHEN_TOML)
    bundle = load_bundle(tmp_path)
    cands = bundle.candidates()["activation.silu_and_mul"]
    opts = VerifyOptions(profiles=("ragged_rows_nonpow2", "decode_batch"), dtypes=(torch.float32, torch.bfloat16))
    report = verify_slot(SILU, cands, opts, runner=InProcessRunner())
    status = {(r.profile, r.dtype): r.status for r in report.results}
    assert status[("ragged_rows_nonpow2", "float32")] == "pass" and status[("decode_batch", "float32")] == "pass", report.results
    lazy = [r for r in report.results if r.dtype == "bfloat16"]
    assert lazy and all(r.status == "fail" and any(c.name == "poison_left" for c in r.failures()) for r in lazy)
