"""Process-wide numeric state (issue 18 item 5): a candidate that leaves flush-to-zero, thread
counts or precision flags changed fails ``global_state_changed`` in both runners, and the state
is put back (isolation/numeric_state.py)."""
from __future__ import annotations

import pytest
import torch

from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.slots.base import KernelSource
from kernelslot.verify import InProcessRunner, VerifyOptions, verify_slot
from kernelslot.isolation import numeric_state
from kernelslot.isolation.worker import WorkerRunner
from tests.isolation.test_worker import CHEATS_DIR

ONE = VerifyOptions(dtypes=(torch.float32,), profiles=("decode_batch",))


def _half_of_min_normal() -> float:
    tiny = 2.2250738585072014e-308
    return tiny / 2.0


def test_guard_reports_and_puts_back_every_kind_of_change():
    with numeric_state.Guard() as guard:
        torch.set_flush_denormal(True)
        assert _half_of_min_normal() == 0.0  # flush-to-zero is really on in this thread
        torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)
        torch.set_default_dtype(torch.float64)
        torch.set_float32_matmul_precision("medium")
        torch.set_grad_enabled(False)
    text = "\n".join(guard.changed)
    for what in ("flush-to-zero", "denormals-are-zero", "torch.get_num_threads()", "torch.get_default_dtype()",
                 "torch.get_float32_matmul_precision()", "torch.is_grad_enabled()"):
        assert what in text, text
    assert guard.unrestored == []
    assert _half_of_min_normal() > 0.0 and torch.get_default_dtype() is torch.float32 and torch.is_grad_enabled()
    assert numeric_state.changes(guard.before, numeric_state.snapshot()) == []


def test_an_unchanged_state_reports_nothing():
    with numeric_state.Guard() as guard:
        torch.ones(4) @ torch.ones(4)
    assert guard.changed == [] and guard.unrestored == []


_AT_IMPORT = """
import torch
torch.set_flush_denormal(True)  # at import: before any prepare or call

def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
"""


@pytest.mark.parametrize("name", ["global_state_flush_to_zero", "global_state_thread_count", "at_import"])
def test_caught_under_the_worker_and_the_worker_is_clean_afterwards(tmp_path, name):
    if name == "at_import":
        path, slot = tmp_path / "ftz_at_import.py", "activation.silu_and_mul"
        path.write_text(_AT_IMPORT)
    else:
        path = CHEATS_DIR / f"{name}.py"
        slot = "norm.rmsnorm" if "flush" in name else "activation.silu_and_mul"
    cand = Candidate(Kernel(None, None, name=name, source=KernelSource(entry="entry", file=str(path))))
    defn = get_slot(slot)
    with WorkerRunner(call_timeout_s=10.0) as worker:
        report = verify_slot(defn, cand, ONE, runner=worker)
        assert not report.passed
        got = report.results[0].check("global_state_changed")
        assert got is not None and got.status == "fail" and "put back" in got.message, report.results[0].failures()
        honest = verify_slot(defn, defn.builtin_candidates(), ONE, runner=worker)
        assert honest.passed, honest.results[0].failures()


def test_in_process_the_referee_state_is_put_back():
    before = numeric_state.snapshot()
    mod = "tests.cheats.global_state_flush_to_zero"
    import importlib

    cheat = importlib.import_module(mod)
    report = verify_slot(get_slot(cheat.SLOT), Candidate(Kernel(cheat.entry, name="ftz")), ONE, runner=InProcessRunner())
    assert report.results[0].check("global_state_changed").status == "fail"
    assert numeric_state.changes(before, numeric_state.snapshot()) == []
