"""``norm.rmsnorm``'s Triton kernel under the referee, interpreted on CPU tensors (Gemma ``1 + w`` included)."""
from __future__ import annotations

import pytest
import torch

from kernelslot.slots import get_slot
from tests.kernels.triton.support import (NUMPY_WARNINGS, assert_verified, ran, require_interpreter,
                                          verify_interpreted)

require_interpreter()
from kernelslot.kernels.triton import norm  # noqa: E402  (after the interpreter is chosen)

pytestmark = list(NUMPY_WARNINGS)
SLOT = "norm.rmsnorm"

FAST = [("gemma_one_plus_w", torch.float32), ("gemma_one_plus_w", torch.bfloat16), ("gemma_one_plus_w", torch.float16),
        ("ragged_rows_nonpow2", torch.bfloat16), ("large_mean_offset", torch.float16),
        ("tiny_values_eps_dominated", torch.float32)]


@pytest.mark.parametrize(("profile", "dtype"), FAST, ids=[f"{p}-{d}".replace("torch.", "") for p, d in FAST])
def test_passes_the_referee(profile: str, dtype: torch.dtype) -> None:
    assert_verified(verify_interpreted(SLOT, norm.rmsnorm, profiles=[profile], dtypes=[dtype]), 1)


def rmsnorm_with_x_row_stride(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float) -> None:
    """The same kernel launched with x's row stride for out (the arena's miner_rmsnorm mistake)."""
    norm._rmsnorm_kernel[(x.shape[0],)](x, weight, out, x.shape[1], float(eps), x.shape[0], 0, x.stride(0), 1,
                                        weight.stride(0), 0, x.stride(0), 1, BLOCK=norm.pow2(x.shape[1], 16))


def test_an_out_stored_with_x_strides_fails_under_the_interpreter() -> None:
    """Interpreted evidence catches a stride bug: padded out rows are left poisoned and their padding written."""
    report = verify_interpreted(SLOT, rmsnorm_with_x_row_stride, profiles=["ragged_rows_nonpow2"], dtypes=[torch.float32])
    assert ran(report) and not report.passed
    assert report.failed_checks() & {"poison_left", "out_of_bounds_write"}, report.failed_checks()


@pytest.mark.slow
def test_passes_every_profile() -> None:
    profiles = get_slot(SLOT).profiles
    assert_verified(verify_interpreted(SLOT, norm.rmsnorm, profiles=sorted({p.name for p in profiles})), len(profiles))


def test_the_registered_variant_passes_in_a_sandboxed_worker_as_interpreted_evidence() -> None:
    """The built-in variant as a bundle row would run (verify/interpreted.py): its module imported in the worker
    under TRITON_INTERPRET=1, its CUDA-only domain dropped, the verdict carrying its evidence."""
    import dataclasses

    from kernelslot.isolation import make_runner
    from kernelslot.verify import VerifyOptions, verify_slot
    from kernelslot.verify.interpreted import EVIDENCE

    defn = get_slot(SLOT)
    (tri,) = [c for c in defn.builtin_candidates() if c.name == "triton.rmsnorm"]
    row = dataclasses.replace(tri, needs=dataclasses.replace(tri.needs, interpret=True))
    runner = make_runner(True, 60.0, device="cpu")
    try:
        report = verify_slot(defn, row, VerifyOptions(profiles=("gemma_one_plus_w", "ragged_rows_nonpow2"),
                                                      dtypes=(torch.bfloat16,), draws=0), runner=runner)
    finally:
        runner.close()
    assert report.passed and report.runner.startswith("worker") and report.verdict == f"pass ({EVIDENCE})"
    assert sorted(ran(report)) == [("gemma_one_plus_w", "bfloat16"), ("ragged_rows_nonpow2", "bfloat16")]
