"""The collective referee: honest built-ins pass at world sizes 2 and 4, every collective cheat fails
with the rank and the reason, a hanging rank is reported within the deadline, and the torchrun
entry point works. Rank processes are shared across tests through session pools (one per deadline).
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from kernelslot.abi import Role, SlotKind
from kernelslot.slots import CATALOG, Candidate, Kernel, get_slot
from kernelslot.slots.base import KernelSource
from kernelslot.slots.collective import rank_shares
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.collective.referee import THREAD_SETTLE_S, CollectiveSession, call_sequence, verify_collective
from kernelslot.verify.single.pipeline import make_case
from tests.helpers import declared

COLLECTIVE = sorted(name for name, d in CATALOG.items() if d.slot.kind is SlotKind.COLLECTIVE)
SHORT_DEADLINE = 5.0  # seconds per call, for the cheats that hang


@pytest.fixture(scope="module")
def pools():
    """Rank processes kept across tests: {deadline: {world: session}}; closed at the end."""
    by_deadline: dict[float, dict[int, CollectiveSession]] = {}
    yield lambda deadline: by_deadline.setdefault(deadline, {})
    for sessions in by_deadline.values():
        for session in sessions.values():
            session.close()


def test_catalog_has_the_four_collective_slots():
    assert COLLECTIVE == ["collective.all_reduce", "collective.ar_residual_rmsnorm",
                          "collective.moe_finalize_ar_rmsnorm", "moe.fused_experts_reduce"]
    for name in COLLECTIVE:
        defn = get_slot(name)
        assert defn.slot.args[-1].role is Role.GROUP
        assert {p.dims["world"] for p in defn.profiles} == {2, 4}
        assert set(defn.dtypes) == {torch.float32, torch.bfloat16}


def test_cases_vary_by_rank_and_tp_shards_rebuild_the_experts():
    defn = get_slot("collective.all_reduce")
    prof = next(p for p in defn.profiles if p.name == "decode_batch.w4")
    shares = rank_shares(make_case(defn, prof, 0, 0))
    assert len(shares) == 4 and not torch.equal(shares[0].inputs["x"], shares[1].inputs["x"])
    fe = get_slot("moe.fused_experts_reduce")
    tp = next(p for p in fe.profiles if p.name == "tp_decode.w2" and p.dtype == torch.float32)
    case = make_case(fe, tp, 0, 0)
    local = [s.prepare_args[0] for s in rank_shares(case)]  # each (E, 2·I/W, H): its gate rows then its up rows
    gate = torch.cat([w[:, : w.shape[1] // 2] for w in local], dim=1)
    up = torch.cat([w[:, w.shape[1] // 2:] for w in local], dim=1)
    w2 = torch.cat([s.prepare_args[1] for s in rank_shares(case)], dim=2)
    x, ids, w = (case.inputs[k].double() for k in ("x", "topk_ids", "topk_weights"))
    full = torch.zeros_like(x)
    for m in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[m, j])
            h = torch.nn.functional.silu(gate[e].double() @ x[m]) * (up[e].double() @ x[m])
            full[m] += w[m, j] * (w2[e].double() @ h)
    torch.testing.assert_close(fe.reference(case)["out"], full.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("world", [2, 4])
def test_builtin_collectives_pass(world, pools):
    sessions = pools(30.0)
    opts = VerifyOptions(world_sizes=(world,))
    start = time.perf_counter()
    for name in COLLECTIVE:
        defn = get_slot(name)
        report = verify_collective(defn, Candidate(defn.incumbent), opts, sessions=sessions)
        ran = [r for r in report.results if not r.skipped_reason]
        assert report.passed, [(r.profile, r.dtype, [(c.name, c.message) for c in r.failures()]) for r in report.results]
        assert ran and all(r.profile.split("~")[0].endswith(f".w{world}") for r in ran)  # drawn: BASE~dI
        assert {r.dtype for r in ran} == {"float32", "bfloat16"}
        for r in ran:  # the state steps and the numeric-state check are made, not skipped
            for check in ("replay", "poison_left", "determinism", "global_state_changed") + (
                    ("reprepare",) if defn.slot.needs_prepare else ()):
                assert r.check(check).status == "pass", (r.profile, check, r.check(check))
    print(f"\nall four collective slots at world {world}: {time.perf_counter() - start:.1f} s (sessions warm after the first)")


def test_verify_slot_routes_collectives(monkeypatch):
    import kernelslot.verify.collective.referee as referee

    calls = []
    monkeypatch.setattr(referee, "verify_collective", lambda defn, cands, opts, progress, sessions=None: calls.append(defn.name) or "routed")
    defn = get_slot("collective.all_reduce")
    assert verify_slot(defn, Candidate(defn.incumbent)) == "routed" and calls == [defn.name]


def test_dependency_runs_one_way():
    """The pipeline knows nothing of collectives; the front door (verify/referee.py) dispatches by slot kind."""
    import inspect

    import kernelslot.verify.single.pipeline as pipeline

    assert "verify.collective" not in inspect.getsource(pipeline)
    with pytest.raises(ValueError, match="collective slot"):
        pipeline.verify_single(get_slot("collective.all_reduce"), Candidate(get_slot("collective.all_reduce").incumbent))


def _cheat(name: str) -> tuple[object, Candidate]:
    mod = importlib.import_module(f"tests.cheats.{name}")
    return mod, Candidate(Kernel(mod.entry, getattr(mod, "prepare", None), name=f"cheat.{name}"))


# cheat, profile, deadline, [(check, rank or None, text in the message)]
CHEATS = [
    ("collective_rank0_only_writes", "decode_batch.w2", 30.0, [("poison_left", 1, "never written")]),
    ("collective_skip_reduction", "decode_batch.w2", 30.0, [("compare", 0, "matched_ratio"), ("compare", 1, "matched_ratio")]),
    ("collective_bf16_reduce", "large_rank_varying_magnitude.w2", 30.0, [("compare", 0, "matched_ratio")]),
    ("collective_reduce_into_input", "decode_batch.w2", 30.0, [("input_mutated", 0, "x:")]),
    ("collective_cache_by_fingerprint", "decode_batch.w2", 30.0, [("replay", 0, "replay 1: out: matched_ratio")]),
    ("collective_experts_no_reduce", "ep_decode.w2", 30.0, [("compare", 0, "matched_ratio")]),
    ("collective_experts_wrap_minus_one", "ep_padded_ids.w2", 30.0,
     [("compare", 0, "it matches the reference with id -1 read as the last local expert")]),
    ("collective_sniffs_shared_memory", "decode_batch.w2", 30.0, [("replay", 0, "plain-output call: out: matched_ratio")]),
    ("collective_own_group", "decode_batch.w2", 30.0, [("raised", 0, "new_group() called by the candidate")]),
    ("collective_rank_raises", "decode_batch.w2", 30.0, [("raised", 1, "cheat: rank 1 gives up")]),
    ("collective_rank_exits", "decode_batch.w2", 30.0, [("raised", 1, "exited with code 7")]),
    ("collective_patches_checks", "decode_batch.w2", 30.0, [("poison_left", 0, "never written"), ("poison_left", 1, "never written")]),
    ("collective_forges_reply", "decode_batch.w2", 30.0,
     [("poison_left", 0, "never written"), ("raised", None, "protocol: expected the 'called' reply")]),
    ("collective_pickle_reply", "decode_batch.w2", 30.0, [("raised", None, "protocol: on its reply channel, a frame is not UTF-8 JSON")]),
    ("collective_default_group", "decode_batch.w2", SHORT_DEADLINE,
     [("raised", 0, "waiting inside torch.distributed (all_reduce)"), ("raised", 1, "waiting inside torch.distributed"),
      ("raised", None, "a collective over a group other than the supplied one")]),
    ("collective_rank_hangs", "decode_batch.w2", SHORT_DEADLINE,
     [("raised", 1, "in candidate code at"), ("raised", 0, "waiting inside torch.distributed (all_reduce)")]),
    ("collective_prepared_cache_by_address", "tp_decode.w2", 30.0,
     [("reprepare", 0, "re-prepared call (weights reloaded in place): out: matched_ratio"),
      ("reprepare", 1, "re-prepared call (weights reloaded in place): out: matched_ratio")]),
    ("collective_late_write", "decode_batch.w2", 30.0,
     [("raised", 0, f"late_write: out changed within {THREAD_SETTLE_S * 1e3:g} ms after entry returned"),
      ("raised", 1, "late_write: out changed")]),
    ("collective_busy_thread", "decode_batch.w2", 30.0,
     [("raised", 0, "thread_left_running: 1 thread(s) kept using CPU after entry returned")]),
    ("collective_global_state", "decode_batch.w2", 30.0,
     [("global_state_changed", 0, "flush-to-zero"), ("global_state_changed", 0, "torch.get_num_threads(): 1 -> 2"),
      ("global_state_changed", 1, "flush-to-zero")]),
]


@pytest.mark.parametrize("name,profile,deadline,expect", CHEATS, ids=[c[0] for c in CHEATS])
def test_collective_cheat_fails_with_rank_and_reason(name, profile, deadline, expect, pools):
    mod, cand = _cheat(name)
    sessions = pools(deadline)
    opts = VerifyOptions(world_sizes=(2,), dtypes=(torch.float32,), profiles=(profile,), collective_timeout_s=deadline)
    if 2 not in sessions:
        sessions[2] = CollectiveSession(2, "cpu", deadline)  # started outside the timed region
    pids = [p.pid for p in sessions[2].procs]
    marker = getattr(mod, "MARKER", None)  # a cheat that tries to run code in the referee
    if marker and os.path.exists(marker):
        os.remove(marker)
    start = time.perf_counter()
    report = verify_collective(get_slot(mod.SLOT), cand, opts, sessions=sessions)
    elapsed = time.perf_counter() - start
    if 2 not in sessions:  # a broken session is closed: none of its processes may survive
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    assert not report.passed and len(report.results) == 1
    failures = report.results[0].failures()
    assert {c.name for c in failures} & set(mod.CATCHES)
    for check, rank, text in expect:
        prefix = f"rank {rank}: " if rank is not None else ""
        assert any(c.name == check and c.message.startswith(prefix) and text in c.message for c in failures), \
            (check, rank, text, [(c.name, c.message[:200]) for c in failures])
    assert not (marker and os.path.exists(marker)), "a rank's reply ran code in the referee"
    if deadline == SHORT_DEADLINE:  # reported at the deadline, not after a gloo timeout or never
        assert elapsed < deadline + 3.0, f"hang reported after {elapsed:.1f} s (deadline {deadline} s)"
        assf = [c for c in failures if "timeout" in c.message]
        assert assf and all(f"within the {deadline:g} s deadline" in c.message for c in assf)


def test_ftz_hidden_from_the_rank_is_read_from_outside(pools):
    """A candidate that patches the rank's own numeric-state snapshot at import and sets flush-to-zero:
    the rank reports nothing, the referee's ptrace reading of the rank's threads sees it."""
    path = Path(__file__).resolve().parents[1] / "cheats" / "collective_ftz_patches_snapshot.py"
    mod = types.SimpleNamespace(**declared(path))  # never imported here: it acts at import
    cand = Candidate(Kernel(None, name="cheat.collective_ftz_patches_snapshot",
                            source=KernelSource(entry="entry", file=str(path))))
    opts = VerifyOptions(world_sizes=(2,), dtypes=(torch.float32,), profiles=("decode_batch.w2",))
    report = verify_collective(get_slot(mod.SLOT), cand, opts, sessions=pools(30.0))
    failures = report.results[0].failures()
    assert {c.name for c in failures} == set(mod.CATCHES), [(c.name, c.message[:200]) for c in failures]
    for rank in (0, 1):
        assert any(c.message.startswith(f"rank {rank}: load/prepare: read from outside the rank process (ptrace)")
                   and "flush-to-zero off -> on" in c.message
                   and c.message.endswith("the rank's own snapshot reported no change (replaced by the candidate?)")
                   for c in failures), [c.message[:300] for c in failures]


def test_scratch_read_before_written_fails_the_repeat_on_poisoned_scratch(pools):
    """Without extra replays the only call on poisoned scratch is the repeat: the cheat's outputs then
    differ bit for bit from the previous call's (``determinism``); every call before passed."""
    mod, cand = _cheat("collective_reads_uninitialised_scratch")
    opts = VerifyOptions(world_sizes=(2,), dtypes=(torch.float32,), profiles=("decode_batch.w2",), extra_mean=0.0)
    report = verify_collective(get_slot(mod.SLOT), cand, opts, sessions=pools(30.0))
    failures = report.results[0].failures()
    first = failures[0]
    assert first.name == "determinism" and first.message.startswith("rank 0: repeated call on poisoned scratch: out: "), \
        [(c.name, c.message[:200]) for c in failures]
    assert "byte(s) differ from the previous call on the same inputs" in first.message


def test_a_write_into_private_padding_shows(pools):
    """The rank's private copies keep the storage (padding included) and are copied back whole: a kernel
    that writes past its view only when its output is not in shared memory fails on a private padded replay."""
    mod, cand = _cheat("collective_private_padding_write")
    defn = get_slot(mod.SLOT)
    base = VerifyOptions(world_sizes=(2,), dtypes=(torch.float32,), profiles=("decode_batch.w2",), extra_mean=4.0)
    seed, private = next((s, c) for s in range(100) for c in call_sequence(defn, dataclasses.replace(base, plan_seed=s), False)
                         if c.private and not c.plain)
    report = verify_collective(defn, cand, dataclasses.replace(base, plan_seed=seed), sessions=pools(30.0))
    failures = report.results[0].failures()
    assert any(c.name == "out_of_bounds_write" and c.message.startswith(f"rank 0: replay {private.draw}: output out: "
                                                                           "wrote outside its view") for c in failures), \
        [(c.name, c.message[:200]) for c in failures]


@pytest.mark.parametrize("name,cause", [("collective_default_group", "a call timed out after the 5 s deadline (call 0)"),
                                        ("collective_rank_exits", "rank 1: process exited with code 7 (during call 0)")])
def test_a_hang_or_a_dead_rank_costs_one_profile_not_one_per_profile(name, cause, pools):
    """After a profile whose ranks deadlocked (a collective on the default world group) or died, the
    candidate's remaining profiles are not run, with the cause: the whole verification costs one deadline."""
    mod, cand = _cheat(name)
    sessions = pools(SHORT_DEADLINE)
    if 2 not in sessions:
        sessions[2] = CollectiveSession(2, "cpu", SHORT_DEADLINE)  # started outside the timed region
    opts = VerifyOptions(world_sizes=(2,), collective_timeout_s=SHORT_DEADLINE)  # every profile, both dtypes, drawn ones
    start = time.perf_counter()
    report = verify_collective(get_slot(mod.SLOT), cand, opts, sessions=sessions)
    elapsed = time.perf_counter() - start
    first, *rest = report.results
    assert not report.passed and not first.passed and len(rest) >= 9
    assert all(r.skipped_reason.startswith(f"not run: {cause}, in {first.profile}[{first.dtype}] seed 0; ") for r in rest), \
        [r.skipped_reason for r in rest]
    assert elapsed < SHORT_DEADLINE + 3.0, f"{len(report.results)} profile runs took {elapsed:.1f} s"


def test_candidate_must_be_loadable_by_the_ranks():
    defn = get_slot("collective.all_reduce")
    opts = VerifyOptions(world_sizes=(2,), profiles=("single_token.w2",), dtypes=(torch.float32,))
    report = verify_collective(defn, Candidate(Kernel(lambda x, out, group: None, name="local")), opts)
    assert not report.passed
    assert "cannot be loaded in another process" in report.results[0].check("raised").message


@pytest.mark.slow  # ~15 s: torchrun's own rendezvous and two fresh interpreters
@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None, reason="torchrun not installed")
def test_torchrun_entry_point_two_ranks_gloo():
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "kernelslot.verify.collective",
           "--slot", "collective.ar_residual_rmsnorm", "--profile", "decode_batch.w2", "--dtype", "float32", "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS collective.ar_residual_rmsnorm decode_batch.w2[float32]" in done.stdout


def test_pass_covers_only_the_world_sizes_that_ran(pools):
    """A domain admitting any group size, verified at 2, is clipped to world_size 2..2 with a note;
    one that declares exactly the verified size gets no note."""
    from kernelslot.abi.capability import CapabilityDomain
    defn = get_slot("collective.all_reduce")
    opts = VerifyOptions(world_sizes=(2,), profiles=("single_token.w2",), dtypes=(torch.float32,))
    any_size = Candidate(defn.incumbent)
    wide = verify_collective(defn, any_size, opts, sessions=pools(30.0))
    assert wide.passed and wide.envelope[any_size.name]["world_size"] == [2, 2]
    assert any("admits world_size >= 1; verified only at 2" in n for n in wide.notes), wide.notes
    exact = Candidate(defn.incumbent, domain=CapabilityDomain.from_mapping({"world_size": {"exact": 2}}))
    narrow = verify_collective(defn, exact, opts, sessions=pools(30.0))
    assert narrow.passed and narrow.envelope[exact.name]["world_size"] == [2, 2] and not narrow.notes


@pytest.mark.slow  # ~15 s: two sessions of fresh rank processes (the cheat counts calls per process)
def test_a_collective_honest_for_40_calls_is_caught_by_the_long_run():
    mod, cand = _cheat("collective_honest_for_40_calls")
    base = VerifyOptions(world_sizes=(2,), dtypes=(torch.float32,), profiles=("decode_batch.w2",))
    plain = verify_collective(get_slot(mod.SLOT), cand, base)  # sessions of its own: fresh call counts
    assert plain.passed, plain.failed_checks()
    longer = verify_collective(get_slot(mod.SLOT), cand, dataclasses.replace(base, long_run=(64, 64)))
    assert not longer.passed
    assert {c.name for c in longer.results[0].failures()} & mod.CATCHES, longer.failed_checks()
