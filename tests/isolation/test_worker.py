"""WorkerRunner: same verdicts as in-process for honest kernels; isolation cheats fail by name;
the referee survives every one of them in one process (issue 6, docs/threat-model.md)."""
from __future__ import annotations

import dataclasses
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch

from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.slots.base import KernelSource
from kernelslot.verify import InProcessRunner, RunnerError, VerifyOptions, verify_slot
from kernelslot.isolation import make_runner
from kernelslot.isolation.worker import RESTART_CAUSES, WorkerRunner
from tests.helpers import declared

CHEATS_DIR = Path(__file__).resolve().parents[1] / "cheats"
ISOLATION = sorted(p.stem for p in CHEATS_DIR.glob("isolation_*.py"))
# Generic cheats whose checks depend on what the worker reports (identity, retention, return value).
WORKER_REPORTED = ("alias_output_into_input", "swaps_output_storage", "retains_tensor", "returns_new_tensor", "input_mutation",
                   "rebinds_input", "sniffs_shared_memory")
HONEST_DIR = Path(__file__).resolve().parent / "honest_kernels"
HONEST = sorted(p.stem for p in HONEST_DIR.glob("*.py") if p.stem != "__init__")
ONE_PROFILE = VerifyOptions(dtypes=(torch.float32,), profiles=("decode_batch",))


def _cheat(name: str) -> tuple[object, Candidate]:
    path = CHEATS_DIR / f"{name}.py"
    mod = types.SimpleNamespace(**declared(path))  # never imported here: some act at import
    prepare = "def prepare(" in path.read_text()
    source = KernelSource(entry="entry", prepare="prepare" if prepare else None, file=str(path))
    return mod, Candidate(Kernel(None, None, name=f"cheat.{name}", source=source))  # loaded by the worker only


@pytest.fixture(scope="module")
def runner():
    r = WorkerRunner(call_timeout_s=6.0, prepare_timeout_s=20.0, memory_limit_gib=0.5, settle_s=0.25)
    yield r
    r.close()


def _verdicts(report) -> list[tuple]:
    return [(r.profile, r.dtype, r.status, tuple((c.name, c.status) for c in r.checks)) for r in report.results]


@pytest.mark.parametrize("slot", ["activation.silu_and_mul", "norm.rmsnorm"])
def test_honest_builtin_same_verdicts_under_both_runners(slot):
    defn = get_slot(slot)
    opts = VerifyOptions(dtypes=(torch.float32, torch.bfloat16))
    with WorkerRunner(call_timeout_s=10.0) as worker:
        isolated = verify_slot(defn, Candidate(defn.incumbent), opts, runner=worker)
        assert worker.restarts == 0
    local = verify_slot(defn, Candidate(defn.incumbent), opts, runner=InProcessRunner())
    assert isolated.passed and local.passed
    assert isolated.runner.startswith("worker/")  # worker/<sandbox mode>
    assert _verdicts(isolated) == _verdicts(local)


def test_every_isolation_cheat_fails_and_the_referee_survives(runner):
    """All isolation cheats through ONE WorkerRunner in this one referee process."""
    assert len(ISOLATION) >= 13, ISOLATION
    reports = {}
    start = time.perf_counter()
    for name in ISOLATION:
        mod, cand = _cheat(name)
        opts = dataclasses.replace(ONE_PROFILE, time=mod.EXPECT[0] == "timing" or getattr(mod, "TIME", False), time_reps=3)
        reports[name] = (mod, verify_slot(get_slot(mod.SLOT), cand, opts, runner=runner))
    elapsed = time.perf_counter() - start
    # the referee is alive and its worker usable: an honest kernel still passes, earlier results are intact
    defn = get_slot("activation.silu_and_mul")
    assert verify_slot(defn, Candidate(defn.incumbent), ONE_PROFILE, runner=runner).passed
    problems = []
    for name, (mod, report) in reports.items():
        check, cause = mod.EXPECT
        result = report.results[0]
        if check == "timing":
            t = result.timing
            if not (report.passed and t["candidate_s"] >= mod.DELAY_S and t.get("candidate_worker_s", 0) >= mod.DELAY_S
                    and t["speedup"] < 1.0):
                problems.append(f"{name}: implausible timing {t} (passed={report.passed})")
            continue
        got = result.check(check)
        if report.passed or got is None or got.status != "fail":
            problems.append(f"{name}: expected {check} to fail, got {[(c.name, c.message[:120]) for c in result.failures()]}")
        elif cause and f"[{cause}]" not in got.message.splitlines()[0]:
            if not (cause == "late_write" and result.check("compare") and result.check("compare").status == "fail"):
                problems.append(f"{name}: {check} failed without cause [{cause}]: {got.message.splitlines()[0]}")
    assert not problems, "\n".join(problems)
    contained = [n for n, (_, rep) in reports.items()
                 if any(c.name == "raised" and c.message.split("]")[0].lstrip("[") in RESTART_CAUSES for c in rep.results[0].failures())]
    assert len(contained) >= 8, contained  # crash, exit, timeout, memory, busy thread, processes left, late writes
    assert runner.restarts == len(contained)  # each contained failure replaced the worker, nothing else did
    assert elapsed < 300  # generous: a loaded machine; what matters is one deadline per hang, not per profile


@pytest.mark.parametrize("name", WORKER_REPORTED)
def test_generic_cheats_caught_the_same_way_under_the_worker(runner, name):
    mod, cand = _cheat(name)
    opts = VerifyOptions(dtypes=(torch.float32,))
    report = verify_slot(get_slot(mod.SLOT), cand, opts, runner=runner)
    assert not report.passed
    assert report.failed_checks() & set(mod.CATCHES), f"{name}: failed only {sorted(report.failed_checks())}"


def test_rebinding_an_input_is_named(runner):
    mod, cand = _cheat("rebinds_input")
    report = verify_slot(get_slot(mod.SLOT), cand, ONE_PROFILE, runner=runner)
    msg = report.results[0].check("input_mutated").message
    assert "x was rebound" in msg and "shape" in msg and "stride" in msg, msg


@pytest.mark.parametrize("how,named", [("x.set_(x.clone())", "storage"), ("x.data = x.clone()", "storage"),
                                       ("x.as_strided_((x.numel(),), (1,), 0)", "shape")])
def test_every_kind_of_input_rebinding_is_caught_in_the_worker(tmp_path, runner, how, named):
    path = tmp_path / "rebind.py"
    path.write_text(f"import torch\ndef entry(x, out):\n    d = x.shape[-1] // 2\n"
                    f"    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())\n    {how}\n")
    cand = Candidate(Kernel(None, None, source=KernelSource(entry="entry", file=str(path))))
    report = verify_slot(get_slot("activation.silu_and_mul"), cand, ONE_PROFILE, runner=runner)
    got = report.results[0].check("input_mutated")
    assert got is not None and got.status == "fail" and named in got.message, report.results[0].failures()


@pytest.mark.parametrize("name", HONEST)
def test_honest_containment_kernels_pass_under_both_runners(runner, name):
    """An idle pool left alive, an untouched 8 GiB reservation, C compiled at import: not failures."""
    source = KernelSource(entry="entry", file=str(HONEST_DIR / f"{name}.py"))
    defn = get_slot("activation.silu_and_mul")
    isolated = verify_slot(defn, Candidate(Kernel(None, None, name=name, source=source)), ONE_PROFILE, runner=runner)
    local = verify_slot(defn, Candidate(Kernel(None, None, name=name, source=source)), ONE_PROFILE, runner=InProcessRunner())
    assert isolated.passed, isolated.results[0].failures()
    assert local.passed, local.results[0].failures()


_PREPARED_KERNEL = '''
import torch

def prepare(weight):
    return {"w2": weight * 2.0}

def entry(x, prepared, out):
    out.copy_(x * prepared["w2"])

def hang(weight):
    import time
    time.sleep(60)
'''


def test_prepared_object_lives_in_the_worker(tmp_path):
    path = tmp_path / "kern.py"
    path.write_text(textwrap.dedent(_PREPARED_KERNEL))
    kernel = Kernel(None, None, name="file-kernel",
                    source=KernelSource(entry="entry", prepare="prepare", file=str(path)))
    with WorkerRunner(call_timeout_s=5.0, prepare_timeout_s=2.0) as worker:
        x, w, out = worker.share([torch.randn(4, 8), torch.randn(8), torch.full((4, 8), float("nan"))])
        ptrs = [t.data_ptr() for t in (x, w, out)]
        handle = worker.prepare(kernel, (w,))
        assert "file-kernel" in repr(handle) and not isinstance(handle, dict)
        for _ in range(2):
            out.fill_(float("nan"))
            x.copy_(torch.randn(4, 8))
            obs = worker.call(kernel, [x, handle, out])
            assert obs.error is None and obs.returned is None and obs.retained == []
            torch.testing.assert_close(out, x * w * 2.0)
            assert obs.worker_s is not None and 0 <= obs.worker_s <= obs.elapsed_s
        assert [t.data_ptr() for t in (x, w, out)] == ptrs  # stable across calls
        hung = Kernel(None, None, source=KernelSource(entry="entry", prepare="hang", file=str(path)))
        with pytest.raises(RunnerError, match=r"timed out after 2s"):
            worker.prepare(hung, (w,))
        stale = worker.call(kernel, [x, handle, out])  # the worker was replaced: the handle is gone
        assert stale.cause == "load_failed" and "prepare() again" in stale.error


_IMPORT_PATCHES = """
import torch

torch.allclose = lambda *a, **k: True  # an import-time side effect

def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
"""


def test_import_side_effects_stay_in_the_worker_and_import_errors_are_named(tmp_path, runner):
    good, bad = tmp_path / "patches.py", tmp_path / "broken.py"
    good.write_text(_IMPORT_PATCHES)
    bad.write_text("raise RuntimeError('boom at import')\n")
    defn = get_slot("activation.silu_and_mul")
    original = torch.allclose
    ok = verify_slot(defn, Candidate(Kernel(None, source=KernelSource(entry="entry", file=str(good)))), ONE_PROFILE, runner=runner)
    assert ok.passed and torch.allclose is original
    failed = verify_slot(defn, Candidate(Kernel(None, source=KernelSource(entry="entry", file=str(bad)))), ONE_PROFILE, runner=runner)
    raised = failed.results[0].check("raised")
    assert raised.status == "fail" and "[load_failed]" in raised.message.splitlines()[0] and "boom at import" in raised.message


def test_a_hang_at_import_costs_one_timeout_and_the_rest_is_not_run(tmp_path):
    path = tmp_path / "hangs.py"
    path.write_text("import time\ntime.sleep(600)\n\ndef entry(x, out):\n    pass\n")
    cand = Candidate(Kernel(None, None, source=KernelSource(entry="entry", file=str(path))))
    with WorkerRunner(call_timeout_s=5.0, prepare_timeout_s=3.0) as worker:
        start = time.perf_counter()
        report = verify_slot(get_slot("activation.silu_and_mul"), cand, VerifyOptions(dtypes=(torch.float32,)), runner=worker)
        elapsed = time.perf_counter() - start
    # profile runs are interleaved in a random order: whichever ran first paid the one timeout
    first = next(r for r in report.results if r.check("raised") is not None)
    rest = [r for r in report.results if r is not first]
    assert "[timeout]" in first.check("raised").message and "importing the candidate" in first.check("raised").message
    assert rest and all(r.skipped_reason.startswith("not run: the candidate failed to load") for r in rest)
    assert not report.passed and elapsed < 3.0 + 60  # one import deadline, not one per profile


def test_make_runner():
    assert isinstance(make_runner(False, 5.0), InProcessRunner)
    r = make_runner(True, 5.0)
    try:
        assert isinstance(r, WorkerRunner) and r.call_timeout_s == 5.0 and r.memory_bytes == 4 << 30
    finally:
        r.close()
    with pytest.raises(ValueError, match="timeouts must be positive"):
        WorkerRunner(call_timeout_s=0)


_SERVING = ("import sys, kernelslot.dispatch.router, kernelslot.engines.transformers.installation, kernelslot.bundle.loader\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'kernelslot')))")
_PROBE = '''
import sys
import torch
SERVING = set({serving!r})


def entry(x, out):
    extra = sorted(m for m in sys.modules if m.split(".")[0] == "kernelslot" and m not in SERVING)
    if extra:
        raise RuntimeError(f"modules a serving process would not hold: {{extra}}")
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
'''


def test_a_worker_holds_no_kernelslot_module_a_serving_process_lacks(runner, tmp_path):
    """sys.modules cannot tell the worker from an engine that installed a bundle (docs/threat-model.md,
    "Identity"): every kernelslot module loaded when the candidate runs is one serving loads too."""
    import subprocess
    import sys

    serving = subprocess.run([sys.executable, "-c", _SERVING], capture_output=True, text=True, check=True).stdout.split()
    assert "kernelslot.dispatch.router" in serving
    probe = tmp_path / "probe_modules.py"
    probe.write_text(_PROBE.format(serving=sorted(serving)))
    cand = Candidate(Kernel(None, None, name="probe.modules", source=KernelSource(entry="entry", file=str(probe))))
    report = verify_slot(get_slot("activation.silu_and_mul"), cand, ONE_PROFILE, runner=runner)
    assert report.passed, [(c.name, c.message[:300]) for r in report.results for c in r.failures()]


_POOL_KERNEL = '''
import torch

_BIG = torch.ones(1 << 18)


def entry(x, out):
    if torch.get_num_threads() != 2:
        raise RuntimeError(f"torch runs {torch.get_num_threads()} threads in the worker, this test needs 2")
    _BIG.mul_(1.0)  # one parallel region per call: libgomp's pool spins a few ms after it, then sleeps
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
'''


def test_a_torch_pool_spinning_down_after_return_is_not_work_after_return(monkeypatch, tmp_path):
    """make test runs with OMP_NUM_THREADS=1; this test gives the worker a two-thread torch pool, whose
    spin after each parallel region must not read as a thread left running (the settle window's grace half)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    kernel = tmp_path / "pool_kernel.py"
    kernel.write_text(_POOL_KERNEL)
    cand = Candidate(Kernel(None, None, name="honest.torch_pool", source=KernelSource(entry="entry", file=str(kernel))))
    with WorkerRunner(call_timeout_s=10.0) as worker:
        report = verify_slot(get_slot("activation.silu_and_mul"), cand, ONE_PROFILE, runner=worker)
    assert report.passed, [(c.name, c.message[:300]) for r in report.results for c in r.failures()]


def test_ftz_hidden_from_the_in_worker_snapshot_is_read_from_outside(runner):
    """The cheat replaces the worker's own numeric-state snapshot; the referee's reading of every
    worker thread's MXCSR / FPCR (ptrace, isolation/fpcontrol.py) still fails it."""
    from kernelslot.isolation import fpcontrol

    if fpcontrol.ARCH not in ("x86_64", "aarch64"):
        pytest.skip(f"no floating-point control register reader for {fpcontrol.ARCH}")
    if runner.fp_unobserved:
        pytest.skip(f"this machine refuses the outside reading: {runner.fp_unobserved}")
    path = CHEATS_DIR / "global_state_ftz_patches_snapshot.py"
    cand = Candidate(Kernel(None, None, name="ftz", source=KernelSource(entry="entry", file=str(path))))
    report = verify_slot(get_slot("norm.rmsnorm"), cand, ONE_PROFILE, runner=runner)
    got = report.results[0].check("global_state_changed")
    assert got is not None and got.status == "fail", report.results[0].failures()
    assert "read from outside the worker" in got.message and "flush-to-zero off -> on" in got.message, got.message
    assert "own snapshot reported no change" in got.message
    defn = get_slot("norm.rmsnorm")
    assert verify_slot(defn, Candidate(defn.incumbent), ONE_PROFILE, runner=runner).passed  # the next worker is clean


def test_closing_a_runner_releases_the_read_only_descriptors_it_made():
    """Each read-only share holds a descriptor of its own, which keeps the shared memory alive: a
    closed runner (an uninstalled bundle's executor) must give every one back."""
    import os

    from kernelslot.isolation.worker import WorkerRunner

    runner = WorkerRunner()
    runner.share(torch.zeros(1 << 16), read_only=True)
    fds = [s.fd for s in runner._shared.values() if s.owns_fd]
    assert fds
    runner.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
