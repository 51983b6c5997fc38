"""Helpers of the Triton kernel tests: skip rules and the referee run of an interpreted kernel."""
from __future__ import annotations

import os
from typing import Callable, Sequence

import pytest
import torch

from kernelslot.slots import get_slot
from kernelslot.slots.base import Candidate, Kernel
from kernelslot.verify import InProcessRunner, SlotReport, VerifyOptions, verify_slot
from tests.helpers import failures


def require_interpreter() -> None:
    """Skip the calling module unless triton is installed and ``TRITON_INTERPRET=1`` (tests/conftest.py)."""
    pytest.importorskip("triton", reason="triton not installed")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is not 1: the compiled kernels are tested by test_cuda.py",
                    allow_module_level=True)


def cpu_candidate(entry: Callable, prepare: Callable | None = None) -> Candidate:
    """A kernel's launcher as a candidate with no domain (the built-in variant's is CUDA-only)."""
    return Candidate(Kernel(entry, prepare, name=f"{entry.__module__.rsplit('.', 1)[-1]}.{entry.__name__}[interpreted]"))


def verify_interpreted(slot: str, entry: Callable, prepare: Callable | None = None, *, profiles: Sequence[str],
                       dtypes: Sequence[torch.dtype] | None = None) -> SlotReport:
    """The referee on ``profiles`` (each of ``dtypes``, default all), CPU tensors, in-process, no drawn profiles."""
    opts = VerifyOptions(profiles=tuple(profiles), dtypes=tuple(dtypes) if dtypes else None, draws=0)
    return verify_slot(get_slot(slot), cpu_candidate(entry, prepare), opts, runner=InProcessRunner())


def ran(report: SlotReport) -> list[tuple[str, str]]:
    """(profile, dtype) of every profile run that was not skipped."""
    return [(r.profile, r.dtype) for r in report.results if not r.skipped_reason]


# numpy's warnings from the interpreter's elementwise ops (exp overflow in a sigmoid tail, NaN
# compared in a codec): the values are what the compiled kernel computes, the warnings noise.
NUMPY_WARNINGS = (pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
                  pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"))


def assert_verified(report: SlotReport, expected_runs: int) -> None:
    """The report passed and ran exactly ``expected_runs`` profile runs (no vacuous pass)."""
    assert report.passed, (failures(report), report.errors)
    assert len(ran(report)) == expected_runs, ran(report)
