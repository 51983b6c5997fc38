"""The referee's own mechanics: allocation, poisoning, replay, routing by domain."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelslot.abi import CapabilityDomain, OutputSpec, allocate_output
from kernelslot.abi.tensor_spec import FINITE_POISON
from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.plan import planner_for
from kernelslot.verify.single.pipeline import plan_for
from kernelslot.verify.plan import STEP_DRAW, Planner, refill_inputs

F32 = VerifyOptions(dtypes=(torch.float32,))
seen: list[dict] = []


def test_padded_outputs_are_not_contiguous_and_canaried():
    a = allocate_output(OutputSpec((3, 5, 7), torch.float32), "cpu")
    assert not a.view.is_contiguous() and a.view.storage_offset() > 0
    assert a.canary_intact()
    a.base[0] = 0.0
    assert not a.canary_intact()
    c = allocate_output(OutputSpec((4, 6), torch.int32, "contiguous"), "cpu")
    assert c.view.is_contiguous()
    c.poison()
    assert (c.view == torch.iinfo(torch.int32).min).all()


def spy(x, out):
    poisoned = bool(torch.isnan(out).all() or (out == FINITE_POISON).all())
    seen.append({"nan": poisoned, "finite": not torch.isnan(out).any(), "ptr": x.data_ptr(), "x0": x.reshape(-1)[-1].item(),
                 "contiguous": out.is_contiguous() and out.storage_offset() == 0})
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())


def test_every_call_sees_poison_and_fresh_inputs_at_stable_addresses():
    seen.clear()
    defn = get_slot("activation.silu_and_mul")
    opts = VerifyOptions(dtypes=(torch.float32,), profiles=("decode_batch",), replays=3, extra_mean=0.0, plan_seed=1)
    plan = plan_for(defn, planner_for(opts))  # the plan verify_slot draws from the same seed
    report = verify_slot(defn, Candidate(Kernel(spy, name="spy")), opts)
    assert report.passed
    # first call + 3 replays (tail, head, row-or-cells refills) + one engine-like call with plain outputs
    # + the state steps: a repeat on poisoned scratch and one metamorphic relation (tokens permuted)
    assert len(seen) == len(plan.calls) == 7
    assert sorted(c.refill for c in plan.calls if c.draw >= STEP_DRAW) == ["relation", "repeat"]
    plain = [c.plain for c in plan.calls].index(True)
    first_replay = [c.draw for c in plan.calls].index(1)
    assert plain > first_replay and seen[plain]["contiguous"] and not seen[plain]["nan"]  # random fill, after replay 1
    padded = [s for i, s in enumerate(seen) if i != plain]
    assert all(s["nan"] for s in padded)  # poisoned before the eager call too
    assert [s["finite"] for s in padded] == [c.poison == "sentinel" for c in plan.calls if not c.plain]
    assert plan.calls[first_replay].poison == "sentinel" and plan.calls[0].poison == "nan"  # the first replay: finite sentinel
    assert len({s["ptr"] for s in seen}) == 1  # same input storage across replays
    assert len({s["x0"] for s in seen}) >= 3  # fresh values (partial refills may keep the last cell)


def test_call_plan_draws_an_unbounded_number_of_calls_and_interleaves_profiles():
    counts = [len(Planner(3, 1.0, plan_seed=s).plan().calls) for s in range(400)]
    assert min(counts) == 5 and max(counts) > 9  # geometric: P(extra >= k) = 2^-k at mean 1
    assert abs(sum(c > 5 for c in counts) / len(counts) - 0.5) < 0.1
    order: list[str] = []

    def logger(x, out):
        order.append(f"{x.shape}")
        spy(x, out)

    verify_slot(get_slot("activation.silu_and_mul"), Candidate(Kernel(logger, name="logger")),
                VerifyOptions(dtypes=(torch.float32,), plan_seed=3))
    firsts = {s: order.index(s) for s in order}
    lasts = {s: len(order) - 1 - order[::-1].index(s) for s in order}
    assert any(firsts[a] < lasts[b] and firsts[b] < lasts[a] for a in firsts for b in firsts if a != b)  # not profile after profile


def test_sparse_refills_change_one_row_or_a_few_cells_of_one_input():
    prev = {"a": torch.arange(30.0).view(6, 5), "b": torch.arange(4.0) + 100,
            "ids": torch.zeros(3, dtype=torch.int64)}
    rows = set()
    for pick in range(40):
        row = refill_inputs(prev, "row", pick)
        changed = {n: (row[n] != prev[n]) for n in prev}
        assert not changed["ids"].any() and sum(bool(c.any()) for c in changed.values()) <= 1
        if changed["a"].any():
            rows.add(tuple(changed["a"].any(1).nonzero().flatten().tolist()))  # one row, values from `a` itself
            assert set(row["a"].flatten().tolist()) <= set(prev["a"].flatten().tolist())
        cells = refill_inputs(prev, "cells", pick)
        assert sum(int((cells[n] != prev[n]).sum()) for n in prev) <= 3
    assert len(rows) > 3 and all(len(r) == 1 for r in rows)


def test_profiles_outside_the_domain_are_skipped_and_unexercised_domains_fail():
    defn = get_slot("activation.silu_and_mul")
    narrow = Candidate(defn.incumbent, CapabilityDomain.from_mapping({"num_tokens": {"range": [1, 1]}}))
    report = verify_slot(defn, narrow, F32)
    assert report.passed
    assert [r.profile for r in report.results if not r.skipped_reason] == ["single_token"]
    never = Candidate(defn.incumbent, CapabilityDomain.from_mapping({"model": {"exact": "gpt-oss"}}))
    report = verify_slot(defn, never, F32)
    assert not report.passed and "never exercised" in report.errors[0]


def test_raising_candidate_is_contained_with_traceback():
    def boom(x, out):
        raise ValueError("kaput")

    report = verify_slot(get_slot("activation.silu_and_mul"), Candidate(Kernel(boom, name="boom")), F32)
    assert not report.passed
    msg = report.results[0].check("raised").message
    assert "ValueError: kaput" in msg


def test_json_report_roundtrip(tmp_path):
    from kernelslot.cli import main
    import json

    out = tmp_path / "r.json"
    assert main(["verify", "--slot", "norm.rmsnorm", "--dtype", "float32", "--quiet", "--json", str(out),
                 "--store", str(tmp_path / "r.db")]) == 0
    data = json.loads(out.read_text())
    assert data["passed"] and data["slots"][0]["slot"] == "norm.rmsnorm"
    import sqlite3

    rows = sqlite3.connect(tmp_path / "r.db").execute("select count(*), min(status) from results").fetchone()
    assert rows[0] == len(data["slots"][0]["results"]) and rows[1] == "pass"


def test_envelope_boundaries_run_and_are_recorded_and_clipped():
    defn = get_slot("norm.rmsnorm")
    opts = VerifyOptions(dtypes=(torch.float32,), envelope=True, plan_seed=0)
    report = verify_slot(defn, Candidate(defn.incumbent), opts)
    assert report.passed
    env = report.envelope[defn.incumbent.name]
    assert env["num_tokens"] == [1, 64] and env["hidden_size"][1] == 4096  # twice the largest profiled value
    assert any("@num_tokens=64" in r.profile for r in report.results)
    bounded = Candidate(defn.incumbent, CapabilityDomain.from_mapping({"num_tokens": {"range": [1, 10**9]}}))
    clipped = verify_slot(defn, bounded, dataclasses.replace(opts, envelope_max_bytes=4 << 20))
    assert clipped.passed and "verified only to" in " ".join(clipped.notes)
    top = clipped.envelope[defn.incumbent.name]["num_tokens"][1]
    assert 32 < top < 10**9


def test_router_routes_only_inside_the_verified_envelope_and_audits():
    from kernelslot.abi import CallDescriptor
    from kernelslot.dispatch import SlotRouter
    from kernelslot.verify.envelope import envelope_domain

    defn = get_slot("norm.rmsnorm")
    cand = Candidate(defn.incumbent, label="variant")
    router = SlotRouter(defn, [cand], verified={"variant": envelope_domain({"num_tokens": [1, 64]})})
    assert router.route(CallDescriptor(num_tokens=64)) == "variant"
    assert router.route(CallDescriptor(num_tokens=65)) == "incumbent"
    # audits: an honest variant is audited (its first call) and kept; one that is wrong in serving is disabled
    x, w = torch.randn(4, 128), torch.ones(128)
    out = torch.empty(4, 128)
    honest = SlotRouter(defn, [cand], audits=True)
    honest(CallDescriptor(num_tokens=4), x, w, out, 1e-6)
    assert honest.counters["variant"].audited == 1 and honest.counters["variant"].audit_mismatch == 0

    liar = SlotRouter(defn, [Candidate(Kernel(_zeros_in_serving, name="liar"), label="liar")], audits=True)
    liar(CallDescriptor(num_tokens=4), x, w, out, 1e-6)
    assert liar.counters["liar"].audit_mismatch == 1 and "liar" in liar.disabled
    assert liar.counters["liar"].mismatches[0].call == 1
    assert torch.allclose(out, x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6))  # the incumbent's answer
    assert liar.route(CallDescriptor(num_tokens=4)) == "incumbent"


def _zeros_in_serving(x, weight, out, eps):
    out.zero_()


def _bad_prepare(kind, layer):
    raise ValueError("layout not supported")


def _never_called(*args):
    raise AssertionError("entry must not run after prepare failed")


def test_prepare_failure_names_type_message_and_frame_and_unrun_checks_are_skipped():
    from kernelslot.report.table import render_slot

    defn = get_slot("moe.block_tkg")
    report = verify_slot(defn, Candidate(Kernel(_never_called, _bad_prepare, name="bad")),
                         VerifyOptions(dtypes=(torch.float32,), profiles=("t1_selective_dense",)))
    table = render_slot(report, defn.describe_comparator())
    assert "ValueError: layout not supported (at test_pipeline.py:" in table and "in _bad_prepare" in table
    r = report.results[0]
    assert {c.name: c.status for c in r.checks}["poison_left"] == "skip"  # never "pass" for a check not made
    assert all(c.status != "pass" for c in r.checks)


def test_tie_partition_and_admissible_rows():
    from kernelslot.abi.comparators import AnyOfRows, tie_partition

    sure, tied = tie_partition(torch.tensor([[1.0, 0.999, 0.5, 2.0]]), torch.full((1, 4), 0.01), 2)
    assert sure.tolist() == [[False, False, False, True]] and tied.tolist() == [[True, True, False, False]]
    sure, tied = tie_partition(torch.tensor([[1.0, 1.0, 0.5]]), torch.zeros(1, 3), 1)  # exact tie: lower index wins
    assert sure.tolist() == [[True, False, False]] and not tied.any()
    choices = AnyOfRows(torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[1.5, 2.5], [0.0, 0.0]]]))
    assert choices.resolve(torch.tensor([[1.5, 2.5], [3.0, 4.0]])).tolist() == [[1.5, 2.5], [3.0, 4.0]]
    assert choices.resolve(torch.zeros(2, 2)).tolist()[1] == [0.0, 0.0]


def test_timing_reads_pairs_and_marks_ratios_that_bracket_one_as_noise():
    from kernelslot.verify.single.timing import time_interleaved
    from kernelslot.verify.plan import TimingPlan
    from kernelslot.isolation.runner import CallObservation

    plan = TimingPlan(1, 4, ("nan",) * 5, (0,) * 5)
    order: list[str] = []

    def side(name, times):
        def call(i):
            order.append(name)
            return CallObservation(elapsed_s=times[i], worker_s=times[i] / 2)
        return call

    clear = time_interleaved(plan, side("A", [9, 1, 1.1, 1.2, 1.1]), side("B", [9, 2, 2.1, 2.2, 2.1]))
    # the sides alternate which goes first: A B, then B A, then A B ...
    assert order[:6] == ["A", "B", "B", "A", "A", "B"] and clear["noise"] == 0.0 and 1.8 < clear["speedup"] < 2.0
    assert clear["candidate_roundtrip_s"] == clear["candidate_worker_s"]
    # the machine's slow phases move both calls of a pair: B is 1.25x A in every pair although the
    # two sides' ranges overlap, and the paired ratio reads exactly that
    drift = time_interleaved(plan, side("A", [9, 1, 2, 1, 2]), side("B", [9, 1.25, 2.5, 1.25, 2.5]))
    assert drift["noise"] == 0.0 and drift["speedup"] == pytest.approx(1.25)
    assert drift["incumbent_s"] / drift["candidate_s"] == pytest.approx(1.25)
    noisy = time_interleaved(plan, side("A", [9, 1, 1, 1, 1]), side("B", [9, 1.2, 0.8, 1.1, 0.9]))
    assert noisy["noise"] == 1.0 and noisy["speedup_q1"] < 1.0 < noisy["speedup_q3"]
    assert time_interleaved(plan, lambda i: None, side("B", [1] * 5)) == {}  # a failed check stops timing


def test_more_timed_pairs_are_sized_on_repetitions_of_the_final_batch_size():
    """Pair 0 is one call (its time caps the batch); the rest are batches of ``n``. A single call,
    mostly its round trip, times ``n`` would claim the plan's pairs fill the target already: the
    extra pairs are sized on the first repetition made at the batch size instead."""
    from kernelslot.verify.single.timing import TARGET_TIMED_S, time_interleaved
    from kernelslot.verify.plan import MORE_REPS, TimingPlan
    from kernelslot.isolation.runner import CallObservation

    reps, n, per_call = 4, 100, 1e-4  # a batch: 10 ms; the target asks for 25 of them
    plan = TimingPlan(1, reps, ("nan",) * (1 + MORE_REPS * reps), (0,) * (1 + MORE_REPS * reps))
    size, pairs = [1], []

    def side(i):
        return CallObservation(elapsed_s=0.01 if i == 0 else per_call)  # per call: a single one is slow

    def end(i):
        pairs.append(i)
        size[0] = n  # the batch grows after pair 0
        return True

    assert time_interleaved(plan, side, side, end=end, calls_per_rep=lambda: size[0])["speedup"] == 1.0
    wanted = round(TARGET_TIMED_S / (per_call * n))
    assert reps < wanted < MORE_REPS * reps  # else the test could not tell
    assert len(pairs) == 1 + wanted  # pair 0's single call x n = 1 s would have left the plan's 4


def test_a_kernel_that_never_loaded_passes_no_call_check(tmp_path):
    from kernelslot.slots.base import KernelSource

    bad = tmp_path / "broken.py"
    bad.write_text("def entry(x, out):\n    return (\n")
    cand = Candidate(Kernel(None, name="broken", source=KernelSource(entry="entry", file=str(bad))))
    report = verify_slot(get_slot("activation.silu_and_mul"), cand, VerifyOptions(dtypes=(torch.float32,), profiles=("single_token",)))
    statuses = {c.name: c.status for c in report.results[0].checks}
    assert statuses["raised"] == "fail"
    assert all(statuses[n] == "skip" for n in ("poison_left", "out_of_bounds_write", "retained_tensor", "compare", "replay"))
