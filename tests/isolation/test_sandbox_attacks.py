"""Cheat bundles that attack the machine rather than the verdict (issue 17, tests/cheats/sandbox_*.py):
each must leave the referee running with a normal verdict, the incumbent's worker alive and
every file the referee trusts unchanged. Skipped where no sandbox runs (they would do real harm)."""
from __future__ import annotations

import hashlib
import os
import secrets
import socket
import tempfile
from pathlib import Path

import pytest
import torch

import kernelslot
from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.slots.base import KernelSource
from kernelslot.isolation import sandbox
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.isolation.worker import WorkerRunner
from tests.helpers import declared

CHEATS_DIR = Path(__file__).resolve().parents[1] / "cheats"
ATTACKS = sorted(p.stem for p in CHEATS_DIR.glob("sandbox_*.py") if not p.stem.startswith("sandbox_collective_"))
ONE_PROFILE = VerifyOptions(dtypes=(torch.float32,), profiles=("decode_batch",))
PACKAGE = Path(kernelslot.__file__).resolve().parent


def _digest(root: Path) -> dict[str, str]:
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _trusted() -> dict[str, object]:
    from kernelslot.kernels.native import build

    home = Path.home()
    return {"package": _digest(PACKAGE), "cache": _digest(build.cache_root()),
            "home": sorted(p.name for p in home.iterdir()), "prefix": sorted(os.listdir(os.sys.prefix))}


def _modes() -> list[str]:
    modes = []
    for mode in ("bwrap", "unshare"):
        try:
            sandbox.select(mode)
            modes.append(mode)
        except sandbox.SandboxUnavailable:
            pass
    return modes


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m != "bwrap" else m for m in ("bwrap", "unshare")])
def test_attacks_reach_nothing_outside_their_sandbox(mode):
    if mode not in _modes():
        pytest.skip(f"sandbox {mode} is not available here")
    assert len(ATTACKS) >= 5, ATTACKS
    defn = get_slot("activation.silu_and_mul")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    with WorkerRunner(call_timeout_s=10.0, prepare_timeout_s=30.0, memory_limit_gib=1.0, sandbox=mode) as runner:
        incumbent = runner.incumbent_runner()
        assert verify_slot(defn, Candidate(defn.incumbent), ONE_PROFILE, runner=incumbent).passed
        incumbent_pid = incumbent._proc.pid
        secrets_planted = [Path(incumbent._scratch) / f"ks-secret-{secrets.token_hex(4)}",
                           Path(tempfile.gettempdir()) / f"ks-secret-{secrets.token_hex(4)}"]
        for p in secrets_planted:
            p.write_text("the incumbent's private data")
        before = _trusted()
        problems = []
        try:
            for name in ATTACKS:
                source = KernelSource(entry="entry", file=str(CHEATS_DIR / f"{name}.py"))
                report = verify_slot(defn, Candidate(Kernel(None, None, name=name, source=source)), ONE_PROFILE, runner=runner)
                verdict, cause = declared(CHEATS_DIR / f"{name}.py")["SANDBOX_VERDICT"]
                result = report.results[0]
                if verdict == "pass" and not report.passed:
                    problems.append(f"{name}: the attack had an effect: {[(c.name, c.message[:160]) for c in result.failures()]}")
                elif verdict != "pass":
                    got = result.check(verdict)
                    if got is None or got.status != "fail" or f"[{cause}]" not in got.message.splitlines()[0]:
                        problems.append(f"{name}: expected {verdict} [{cause}], got {[(c.name, c.message[:160]) for c in result.failures()]}")
        finally:
            for p in secrets_planted:
                p.unlink()
        assert not problems, "\n".join(problems)
        os.kill(incumbent_pid, 0)  # the incumbent's worker is alive, the same one, and still serves
        assert verify_slot(defn, Candidate(defn.incumbent), ONE_PROFILE, runner=incumbent).passed
        assert incumbent._proc.pid == incumbent_pid and incumbent.restarts == 0
    assert _trusted() == before
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


def _host_listener() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    return listener


@pytest.mark.parametrize("mode", ["bwrap", pytest.param("unshare", marks=pytest.mark.slow),
                                  pytest.param("none", marks=pytest.mark.slow)])
def test_collective_ranks_reach_only_their_own_loopback(mode, monkeypatch):
    """Every rank of a group shares one private network namespace: the honest collective still
    meets on its loopback, and a rank that connects to the host's loopback reaches nothing.
    ``none`` is the control: without a sandbox the same cheat does reach the host and fails."""
    from kernelslot.verify.collective.referee import verify_collective

    if mode != "none" and mode not in _modes():
        pytest.skip(f"sandbox {mode} is not available here")
    if mode != "none" and not sandbox.select(mode).group_netns:
        pytest.skip("no private network namespace for collective ranks here (threat-model.md says what then)")
    name = "sandbox_collective_network"
    defn = get_slot(declared(CHEATS_DIR / f"{name}.py")["SLOT"])
    listener = _host_listener()
    monkeypatch.setenv("KERNELSLOT_SANDBOX", mode)
    monkeypatch.setenv("KERNELSLOT_CHEAT_HOST_PORT", str(listener.getsockname()[1]))
    opts = VerifyOptions(world_sizes=(2,), dtypes=(torch.float32,), profiles=("decode_batch.w2",))
    source = KernelSource(entry="entry", file=str(CHEATS_DIR / f"{name}.py"))
    try:
        report = verify_collective(defn, Candidate(Kernel(None, None, name=name, source=source)), opts)
        failures = [(c.name, c.message[:160]) for r in report.results for c in r.failures()]
        if mode == "none":
            assert not report.passed and any(n == "compare" for n, _ in failures), failures
            listener.accept()[0].close()  # it did connect
        else:
            assert report.passed, failures
            with pytest.raises(BlockingIOError):
                listener.accept()
    finally:
        listener.close()
