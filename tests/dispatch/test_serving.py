"""Serving a bundle out of its reach (issue 25 parts 1 and 4): the sandboxed executor, and audits in
the trusted process at calls 1, 2, 4, ... of every signature.

Each serving cheat (tests/cheats/serving_*.py) is served many calls through a SlotRouter: it is either
honest on every call (its tell does not work in the executor) or caught by an audit, and no call after
the first mismatch returns a wrong output."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
import torch

from kernelslot.abi import CallDescriptor
from kernelslot.dispatch import SlotRouter
from kernelslot.isolation.executor import Executor, ExecutorCallError
from kernelslot.isolation.worker import WorkerRunner
from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.slots.base import KernelSource

CHEATS = Path(__file__).resolve().parents[1] / "cheats"
SERVED = str(Path(__file__).resolve().parents[1] / "isolation" / "served" / "kernels.py")
RMSNORM = get_slot("norm.rmsnorm")


def _served(entry: str, prepare: str | None = None) -> Kernel:
    return Kernel(None, None, name=entry, source=KernelSource(entry=entry, prepare=prepare, file=SERVED))


def _cheat(name: str) -> Candidate:
    return Candidate(Kernel(None, None, name=name, source=KernelSource(entry="entry", file=str(CHEATS / f"{name}.py"))),
                     label=name)


@pytest.fixture(scope="module")
def executor():
    ex = Executor(call_timeout_s=10.0)
    yield ex
    ex.close()


def _reference(x, w, eps):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


def _serve(router: SlotRouter, calls: int, shape=(4, 128)) -> list[int]:
    """The call numbers (1-based) whose output was wrong."""
    wrong = []
    w = torch.randn(shape[-1])
    for n in range(1, calls + 1):
        x = torch.randn(*shape)
        out = torch.empty(*shape)
        router(CallDescriptor(num_tokens=shape[0]), x, w, out, 1e-6)
        if not torch.allclose(out, _reference(x, w, 1e-6), atol=1e-5, rtol=1e-4):
            wrong.append(n)
    return wrong


def test_executor_serves_prepared_state_from_read_only_weights(executor):
    w = torch.randn(8)
    kept = w.clone()
    p = executor.prepare(_served("scale", "prepare"), (w,))
    x, out = torch.randn(8), torch.empty(8)
    executor.call(_served("scale", "prepare"), (x, p, out), (2,))
    assert torch.equal(out, x * kept * 2)
    with pytest.raises(Exception, match="SIGSEGV"):  # prepare writes the engine's weights: mapped read-only
        executor.prepare(_served("writes_weights", "prepare_writes_weights"), (w,))
    assert torch.equal(w, kept)


def test_executor_contains_failures_and_the_engines_tensors_are_never_the_candidates(executor):
    x, out = torch.ones(4), torch.empty(4)
    with pytest.raises(ExecutorCallError) as e:  # inputs are read-only staging copies
        executor.call(_served("writes_input"), (x, out), (1,))
    assert e.value.cause == "crash" and torch.equal(x, torch.ones(4))
    for name, cause in (("raises", "exception"), ("crashes", "exit")):
        with pytest.raises(ExecutorCallError) as e:
            executor.call(_served(name), (x, out), (1,))
        assert e.value.cause == cause
    with pytest.raises(ExecutorCallError) as e:  # an output it never wrote comes back poisoned
        executor.call(_served("returns_value"), (x, out), (1,))
    assert e.value.cause == "returned_value"
    executor.call(_served("noop"), (x, out), (1,))
    assert out.isnan().all()


def test_the_executor_worker_is_the_verification_worker_from_inside(executor):
    """Sandbox, identity, environment and the call stack as the candidate sees them: one fingerprint."""
    kernel = _served("fingerprint")
    served = torch.zeros(1, dtype=torch.float64)
    executor.call(kernel, (torch.zeros(1), served), (1,))
    with WorkerRunner(call_timeout_s=10.0) as runner:
        verified = torch.zeros(1, dtype=torch.float64)
        obs = runner.call(kernel, [torch.zeros(1), verified])
        assert obs.error is None, obs.error
    assert served.item() == verified.item() != 0


@pytest.mark.parametrize("honest_calls", [0, 1, 3, 16, 40, 100])
def test_audits_catch_a_kernel_honest_for_n_calls_at_the_first_power_of_two_above_n(honest_calls):
    calls = {"n": 0}

    def stale(x, weight, out, eps):
        calls["n"] += 1
        out.copy_(_reference(x, weight, eps) if calls["n"] <= honest_calls else torch.zeros_like(out))

    router = SlotRouter(RMSNORM, [Candidate(Kernel(stale, name="stale"), label="stale")], audits=True)
    wrong = _serve(router, 300)
    caught = 1 << honest_calls.bit_length()  # the first power of two above N
    [m] = router.counters["stale"].mismatches
    assert m.call == caught and m.variant == "stale" and "float32[4, 128]" in m.signature and "out:" in m.statistic
    assert wrong == list(range(honest_calls + 1, caught))  # wrong between N and the audit, never after
    assert router.counters["stale"].audited == caught.bit_length()


def test_the_audit_floor_samples_calls_between_the_powers_of_two():
    honest = SlotRouter(RMSNORM, [Candidate(RMSNORM.incumbent, label="v")], audits=True, audit_floor=0.5)
    assert _serve(honest, 200) == []
    audited = honest.counters["v"].audited
    assert 8 + 60 < audited < 8 + 140 and honest.counters["v"].audit_mismatch == 0


@pytest.mark.parametrize("cheat", ["serving_sandbox_tell", "serving_stack_tell"])
def test_a_tell_buys_nothing_in_the_executor_and_is_caught_in_process(executor, cheat):
    served = SlotRouter(RMSNORM, [_cheat(cheat)], executor=executor, audits=True)
    assert _serve(served, 20) == [] and served.counters[cheat].audit_mismatch == 0
    assert served.counters[cheat].completed == 20
    import importlib

    mod = importlib.import_module(f"tests.cheats.{cheat}")  # harmless at import: it only reads its surroundings
    local = SlotRouter(RMSNORM, [Candidate(Kernel(mod.entry, name=cheat), label=cheat)], audits=True)
    assert _serve(local, 20) == []  # wrong at call 1, which is audited: the incumbent's output replaces it
    assert local.counters[cheat].mismatches[0].call == 1 and cheat in local.disabled


@pytest.mark.parametrize("cheat, caught", [("serving_honest_for_40_calls", 64), ("serving_patches_audit", 1)])
def test_serving_cheats_are_caught_by_the_audits_and_wrong_no_more(executor, cheat, caught):
    router = SlotRouter(RMSNORM, [_cheat(cheat)], executor=executor, audits=True)
    wrong = _serve(router, 100)
    [m] = router.counters[cheat].mismatches
    assert m.call == caught and all(n < caught for n in wrong), (m, wrong)
    assert cheat in router.disabled


def test_executor_round_trip_is_stated(executor, capsys):
    """The per-call overhead of a no-op entry (printed; benchmarks/executor_overhead.py states it)."""
    kernel = _served("noop")
    x, out = torch.randn(1, 64), torch.empty(1, 64)
    times = []
    for _ in range(300):
        t0 = time.perf_counter()
        executor.call(kernel, (x, out), (1,))
        times.append(time.perf_counter() - t0)
    median = statistics.median(times[50:])
    print(f"executor no-op round trip: median {median * 1e6:.0f} us")
    assert median < 0.05  # a sanity bound (50 ms), not a performance assertion
