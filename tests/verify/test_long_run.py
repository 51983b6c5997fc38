"""The secret long run (issue 26 part 6, verify/plan.py ``long_run``): per slot verification one profile
run, drawn among those the candidate's domain admits, gets a log-uniform number of extra replays, so a
kernel honest for its first N calls of a signature is caught for every N below that run's length."""
from __future__ import annotations

import collections
import dataclasses
import math
import random

import pytest
import torch

import tests.cheats.honest_for_40_calls as honest_for_40
from kernelslot.abi import CapabilityDomain
from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.plan import BUNDLE_LONG_RUN, LONG_DRAW, REFILLS, Planner, log_uniform

LOW, HIGH = BUNDLE_LONG_RUN


def _share_at_least(k: int, low: int = LOW, high: int = HIGH) -> float:
    """``P(L >= k)`` of the documented distribution."""
    return 1.0 if k <= low else max(0.0, math.log((high + 1) / k) / math.log((high + 1) / low))


def test_the_length_is_log_uniform_between_the_bounds():
    rng = random.Random(1)
    draws = [log_uniform(rng, LOW, HIGH) for _ in range(20000)]
    assert min(draws) == LOW and max(draws) == HIGH
    for k in (17, 24, 34, 64, 128, 200, 256):
        share = sum(d >= k for d in draws) / len(draws)
        assert abs(share - _share_at_least(k)) < 0.015, (k, share, _share_at_least(k))
    assert {log_uniform(rng, 40, 40) for _ in range(50)} == {40}


def _plans(planner: Planner, n: int) -> list:
    return [planner.plan(reprepare=True, repeat=True, relations=1) for _ in range(n)]


def test_one_plan_gets_the_long_sequence_and_nothing_marks_its_calls():
    planner = Planner(extra_mean=2.0, plan_seed=7, long_run=BUNDLE_LONG_RUN)
    plain_at, private, scratch, kinds = [], [], [], collections.Counter()
    for _ in range(200):
        plans = _plans(planner, 6)
        index, long = planner.lengthen_one(plans, lambda i: True)
        short = plans[index]
        added = [c for c in long.calls if c.draw >= LONG_DRAW]
        assert LOW <= len(added) <= HIGH and len(long.calls) == len(short.calls) + len(added)
        assert long.calls[0] == short.calls[0] and set(short.calls) <= set(long.calls)  # every call of the plan kept
        assert [c.refill for c in long.calls].count("reprepare") == 1 and sum(c.plain for c in long.calls) == 1
        assert sorted(c.relation for c in long.calls if c.refill == "relation") == [0]
        assert [c for c in long.calls if c.draw in range(1, 4)] == [c for c in short.calls if c.draw in range(1, 4)]  # base order
        where = [i for i, c in enumerate(long.calls) if c.plain][0]
        assert where >= 2  # after the first call and at least one replay, as in every plan
        plain_at.append(where / (len(long.calls) - 1))
        private += [c.private for c in added]
        scratch += [c.scratch for c in added]
        kinds.update((c.refill, c.poison) for c in added)
    # drawn as every extra replay is: kinds, poisons, private and poisoned-scratch shares
    assert set(kinds) == {(r, p) for r in REFILLS for p in ("nan", "sentinel")}
    assert abs(sum(private) / len(private) - 0.5) < 0.03 and abs(sum(scratch) / len(scratch) - 0.5) < 0.03
    # the plain call and the state steps are placed again among all replays: not bunched at the start
    assert 0.4 < sum(plain_at) / len(plain_at) < 0.6


def test_the_long_run_is_drawn_uniformly_among_the_admitted_runs_only():
    planner = Planner(plan_seed=3, long_run=(LOW, LOW))
    plans = _plans(planner, 5)
    asked = []

    def admitted(i: int) -> bool:
        asked.append(i)
        return i in (1, 3)

    chosen = collections.Counter()
    for _ in range(2000):
        asked.clear()
        chosen[planner.lengthen_one(plans, admitted)[0]] += 1
        assert asked[-1] in (1, 3) and len(set(asked)) == len(asked)  # asked only until one is admitted, each once
    assert set(chosen) == {1, 3} and abs(chosen[1] / 2000 - 0.5) < 0.05
    assert planner.lengthen_one(plans, lambda i: False) is None
    assert Planner(plan_seed=3).lengthen_one(plans, lambda i: True) is None  # the built-ins' plan: no long run
    with pytest.raises(ValueError):
        Planner(long_run=(0, 10))


def _counting_rmsnorm(counts: collections.Counter):
    incumbent = get_slot("norm.rmsnorm").incumbent

    def entry(x, weight, out, eps):
        counts[(tuple(x.shape), str(x.dtype))] += 1
        incumbent.entry(x, weight, out, eps)

    return Kernel(entry, None, name="counting")


def test_verify_gives_exactly_one_admitted_run_the_long_sequence():
    """Three profiles in two dtypes, the domain admitting float32 only: one float32 run makes 20 more calls."""
    opts = VerifyOptions(dtypes=(torch.float32, torch.bfloat16), draws=0, extra_mean=0.0, long_run=(20, 20),
                         profiles=("decode_batch", "single_token", "ragged_rows_nonpow2"))
    domain = CapabilityDomain.from_mapping({"dtype": {"one_of": ["float32"]}})
    for seed in range(4):
        counts: collections.Counter = collections.Counter()
        report = verify_slot(get_slot("norm.rmsnorm"), Candidate(_counting_rmsnorm(counts), domain),
                             dataclasses.replace(opts, plan_seed=seed))
        assert report.passed, [(r.profile, r.skipped_reason) for r in report.results]
        base = 5 + 2  # first, 3 replays, the plain call; S = 2 state steps for norm.rmsnorm (repeat, permutation)
        assert sorted(counts.values()) == [base, base, base + 20], counts
        assert all(dtype == "torch.float32" for _, dtype in counts)  # the bfloat16 runs were skipped, never long


def _verify_honest_for_40(long_run: tuple[int, int] | None):
    honest_for_40._calls.clear()
    opts = VerifyOptions(dtypes=(torch.float32,), draws=0, extra_mean=0.0, long_run=long_run)
    return verify_slot(get_slot("norm.rmsnorm"), Candidate(Kernel(honest_for_40.entry, None, name="honest_for_40")), opts)


def test_a_kernel_honest_for_40_calls_passes_without_the_long_run_and_is_caught_by_it():
    assert _verify_honest_for_40(None).passed  # 7 calls per run: never past 40
    # a long run of at least 34 more calls makes 5 + 2 + 34 = 41 calls of one signature: always caught
    report = _verify_honest_for_40((34, 64))
    assert not report.passed and "replay" in report.failed_checks()
    # the bundle's distribution catches it with the probability the cheat's docstring states
    assert abs(_share_at_least(34) - 0.7285) < 1e-4


def test_the_cli_turns_it_on_for_bundles_only(capsys):
    from kernelslot import cli

    parser = cli.build_parser()
    bundle = cli._options(parser.parse_args(["verify", "examples/honest_norm"]), [("norm.rmsnorm", [])])
    builtin = cli._options(parser.parse_args(["verify"]), [("norm.rmsnorm", [])])
    assert (bundle.long_run, bundle.extra_mean) == (BUNDLE_LONG_RUN, 2.0)
    assert (builtin.long_run, builtin.extra_mean) == (None, 0.25)
