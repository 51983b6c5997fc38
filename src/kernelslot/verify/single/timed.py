"""The timed calls of one profile run (``--time``): candidate and incumbent side by side, through
identical runners, in batches of calls on inputs of their own.

Methodology (the numbers: :mod:`kernelslot.verify.single.timing`):

- **Identical runners.** The incumbent runs through ``runner.incumbent_runner()``: a sibling of
  the candidate's runner of the same kind (a worker in a sandbox of its own, or in-process for an
  in-process candidate), never the referee's own process for an isolated candidate. A built-in
  timed against itself is the method's self-check: it must read x1.0 within noise.
- **Batches.** One request runs ``n`` calls back to back, each on its own set of live inputs
  (fresh values every repetition) and its own poisoned padded outputs, each checked afterwards
  exactly like any replay; the referee's clock over the request, divided by ``n``, is a
  repetition's time. ``n`` is sized on the *incumbent* before the pairs, so that the request's
  own cost (its round trip less the worker's time over the calls' loop, which the worker times as
  one span: the loop's own cost, a fraction of a microsecond a call, is work both sides pay alike)
  is at most :data:`ROUNDTRIP_SHARE` of the work: single calls give a first size, batches of that
  size (warm calls, and a batch's own request cost) a larger one where they ask for it, within
  :data:`MAX_BATCH` calls, :data:`MAX_BATCH_BYTES` of inputs and outputs and :data:`MAX_BATCH_S`
  at the slower side's time in the first warm-up pair (made with single calls). In-process there
  is no round trip and a call's time is the entry's own; ``n`` is then what makes a repetition
  last :data:`MIN_REPETITION_S` (at most :data:`MAX_IN_PROCESS_BATCH`), so a repetition of a
  microsecond kernel is a mean over many calls rather than one call's jitter.
- **Back to back, alternating order, one prologue.** Pair ``i`` draws its inputs once; both sides'
  prologues (every input read for the snapshot, every output poisoned: the incumbent writes
  outputs of its own, so the candidate's wait intact to be judged) and both batches' staging come
  first; then the two timed steps run back to back, in alternating order (the candidate first in
  even pairs), and only then are both reported and the candidate's calls judged. So the two
  repetitions of a pair are milliseconds apart and a slow phase of the machine (a busy neighbour,
  a core waking from idle) moves both, which the paired ratio (``timing.py``) cancels; and the
  second step of a pair, which finds the inputs in cache, is each side's equally often.
- **The other side frozen.** While one side's batch runs, every process of the other side's
  runner is stopped (SIGSTOP, waited for): a helper thread or a spinning thread pool of one side
  cannot take the CPU from the other's timed calls.

Set 0 of a batch is the profile run's own case; the other sets copy its live inputs into
storages of their own. Each repetition draws set 0's live inputs afresh (``make_case``) and fills
every other set with a random permutation of those values (floating-point inputs; integer inputs,
such as expert ids, are copied), so every call works on values no other call of the batch saw.
"""
from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Any

import torch

from kernelslot.abi import allocate_output
from kernelslot.isolation.runner import CallObservation, Runner, RunnerError, StagedBatch
from kernelslot.slots.base import Case
from kernelslot.verify.cases import refill_live, tensors_in
from kernelslot.verify.plan import TIMED_DRAW, PlannedCall, TimingPlan
from kernelslot.verify.single import roofline
from kernelslot.verify.single.timing import impossible_message, time_interleaved
from kernelslot.verify.verdict import FAIL, Check

__all__ = ["time_profile", "batch_size", "batch_cap", "ROUNDTRIP_SHARE", "MAX_BATCH", "MAX_BATCH_BYTES", "MAX_BATCH_S"]

ROUNDTRIP_SHARE = 0.02  # a request's own cost, at most this share of a batch's work (the 5% aim over 2.5: timed requests cost more)
MAX_BATCH = 1024  # calls per request
MAX_BATCH_BYTES = 128 << 20  # live inputs and outputs of a batch's extra sets together
MAX_BATCH_S = 0.25  # a batch takes at most about this long on the slower side's warm-up figure
MIN_REPETITION_S = 5e-4  # in-process: a repetition's calls last at least about this long
MAX_IN_PROCESS_BATCH = 64  # in-process: calls per repetition
CALIBRATION_CALLS = 7  # the incumbent's calls per calibration round (single calls, then batches)


def batch_size(incumbent: list[CallObservation], batched: list[CallObservation] | None = None, calls: int = 1) -> int:
    """Calls per request for the incumbent's single-call figures ``incumbent`` (and, where made, its
    per-call figures in batches of ``calls`` calls, ``batched``: a call in a batch runs warm, much
    faster than a single one, so the work per call is read there, and so is the request's own cost,
    which a batch's request pays more of than a single call's): enough that a request's own cost (the
    round trip less the in-worker time) is at most :data:`ROUNDTRIP_SHARE` of the batch's work,
    within :data:`MAX_BATCH`. In-process there is no round trip (a call's time is the entry's own):
    enough calls that a repetition lasts :data:`MIN_REPETITION_S`, within
    :data:`MAX_IN_PROCESS_BATCH`, so one interrupted call moves a repetition's mean, not its median."""
    if any(o.worker_s is None or o.worker_s <= 0 for o in incumbent):
        per_call = statistics.median(o.elapsed_s for o in batched or incumbent) if incumbent else 0.0
        if per_call <= 0:
            return 1
        return max(1, min(MAX_IN_PROCESS_BATCH, math.ceil(MIN_REPETITION_S / per_call)))
    work = statistics.median(o.worker_s for o in batched or incumbent)  # type: ignore[misc]
    overhead = max(0.0, statistics.median((o.elapsed_s - o.worker_s) * (calls if batched else 1)  # type: ignore[operator]
                                          for o in batched or incumbent))
    return max(1, min(MAX_BATCH, math.ceil(overhead / (ROUNDTRIP_SHARE * max(work, 1e-9)))))


def batch_cap(candidate: CallObservation, incumbent: CallObservation, set_bytes: int) -> int:
    """The most calls a request may make: :data:`MAX_BATCH_S` at the slower side's time per call (the
    in-worker time where measured: a single call's round trip is mostly the request), and
    :data:`MAX_BATCH_BYTES` of inputs and outputs. A candidate that under-reports its in-worker time
    only makes its own batches longer (a timeout fails it); it cannot look faster."""
    def per_call(o: CallObservation) -> float:
        return o.worker_s if o.worker_s is not None else o.elapsed_s
    slowest = max(per_call(candidate), per_call(incumbent), 1e-9)
    return max(1, min(MAX_BATCH, int(MAX_BATCH_S / slowest), MAX_BATCH_BYTES // max(1, set_bytes)))


def _twin(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in a storage of its own with the same size, offset and strides (the same layout)."""
    storage = torch.empty(t.untyped_storage().nbytes(), dtype=torch.uint8, device=t.device).untyped_storage()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride()).copy_(t)


def _shuffled(values: dict[str, torch.Tensor], rng: random.Random) -> dict[str, torch.Tensor]:
    """``values`` with every floating-point tensor's elements permuted (integer tensors copied)."""
    out = {}
    for name, t in values.items():
        if t.dtype.is_floating_point and t.numel() > 1:
            gen = torch.Generator().manual_seed(rng.getrandbits(63))
            flat = t.contiguous().view(-1)
            out[name] = flat[torch.randperm(flat.numel(), generator=gen)].view(t.shape)
        else:
            out[name] = t.clone()
    return out


class _Batch:
    """The sets of inputs and outputs one request calls on, for the candidate and the incumbent."""

    def __init__(self, run: Any, trusted: Runner, inc_prepared: Any):
        self.run, self.trusted, self.inc_prepared = run, trusted, inc_prepared
        self.live = run.case.live_names()
        self.cases: list[Case] = [run.case]
        self.refs: list[Case] = [run.ref_case]
        self.outputs: list[dict] = [run.outputs]
        self.args: list[list[Any]] = [run.args]
        self.inc_outputs: list[dict] = []
        self.inc_args: list[list[Any]] = []
        self._add_incumbent_set(run.case)
        self.active = 1  # the sets the next request calls on (the first ``active``)

    def set_bytes(self) -> int:
        live = sum(t.untyped_storage().nbytes() for n in self.live for t in tensors_in(self.run.case.inputs[n]).values())
        return live + 2 * sum(a.base.untyped_storage().nbytes() for a in self.run.outputs.values())  # both sides' outputs

    def _add_incumbent_set(self, case: Case) -> None:
        """The incumbent's outputs for ``case``'s set: its own, so the candidate's stay as they were
        left until they are judged, after both sides ran."""
        run = self.run
        outputs = {k: allocate_output(spec, run.device) for k, spec in case.outputs.items() if spec is not None}
        self.trusted.share([a.base for a in outputs.values()])
        prepared = run.prepared if self.inc_prepared is None else self.inc_prepared
        self.inc_outputs.append(outputs)
        self.inc_args.append(run._args(case, outputs, prepared))

    def grow(self, n: int) -> None:
        """Make ``n`` sets active, allocating (and sharing) the ones that do not exist yet."""
        run = self.run
        self.active = n
        while len(self.cases) < n:
            inputs = {**run.case.inputs, **{k: _twin(run.case.inputs[k]) for k in self.live}}
            case = dataclasses.replace(run.case, inputs=inputs)
            outputs = {k: allocate_output(spec, run.device) for k, spec in run.case.outputs.items() if spec is not None}
            run.runner.share([case.inputs[k] for k in self.live] + [a.base for a in outputs.values()])
            self.cases.append(case)
            self.refs.append(run.ref_case)
            self.outputs.append(outputs)
            self.args.append(run._args(case, outputs, run.prepared))
            self._add_incumbent_set(case)

    def refill(self, i: int, pick: int) -> None:
        """Fresh live inputs for repetition ``i``: a new draw in set 0, permutations of it elsewhere."""
        run = self.run
        run.ref_case = self.refs[0] = refill_live(run.defn, run.profile, run.seed, TIMED_DRAW + i, run.case, run.ref_case)
        rng = random.Random(pick)
        base = {n: run.ref_case.inputs[n] for n in self.live}
        for k in range(1, self.active):
            now = _shuffled(base, rng)
            for name, value in now.items():
                self.cases[k].inputs[name].copy_(value)
            self.refs[k] = dataclasses.replace(run.ref_case, inputs={**run.ref_case.inputs, **now})

    def incumbent_args(self) -> list[list[Any]]:
        return self.inc_args[:self.active]

    def poison_incumbent(self, call: PlannedCall) -> None:
        """The incumbent's outputs poisoned as the candidate's are (the same prologue)."""
        for outputs in self.inc_outputs[:self.active]:
            for alloc in outputs.values():
                if not call.plain:
                    alloc.poison(finite=call.poison == "sentinel")


def _batch_observation(observations: list[CallObservation], mean: float) -> CallObservation:
    """One repetition: the batch's referee time per call, and the mean in-worker time where measured."""
    worker = [o.worker_s for o in observations]
    return CallObservation(elapsed_s=mean, worker_s=statistics.fmean(worker) if all(w is not None for w in worker) else None)


def _complete(timed: CallObservation, observations: list[CallObservation], mean: float) -> None:
    """Fill ``timed`` (made when its batch ran) with the batch's figures, as :func:`_batch_observation` makes them."""
    done = _batch_observation(observations, mean)
    timed.elapsed_s, timed.worker_s, timed.error = done.elapsed_s, done.worker_s, observations[-1].error


def _incumbent_steps(trusted: Runner, incumbent: Any, batch: _Batch) -> list[CallObservation]:
    """:data:`CALIBRATION_CALLS` of the incumbent's batches on ``batch``'s active sets, each made as a
    timed step is (staged, the worker stopped, woken, run): one repetition's figures each."""
    steps = []
    for _ in range(CALIBRATION_CALLS):
        one = trusted.stage_batch(incumbent, batch.incumbent_args(), check_retention=False)
        trusted.freeze()
        trusted.run_staged(one)
        observations, mean = trusted.finish_batch(one)
        if observations[-1].error:
            raise RunnerError(f"the incumbent failed: {observations[-1].error.strip().splitlines()[-1]}")
        steps.append(_batch_observation(observations, mean))
    return steps


def _calibrate(trusted: Runner, incumbent: Any, batch: _Batch) -> int:
    """The batch size, from the incumbent (trusted code, unchecked) before the plan's pairs: its single
    calls for the request's own cost, then (where that asks for more than one call) batches of the
    size they suggest for the work per call, which runs warm there, and for a batch's own request
    cost; the largest size any round asks for."""
    single = _incumbent_steps(trusted, incumbent, batch)
    size = batch_size(single)
    room = MAX_BATCH_BYTES // max(1, batch.set_bytes())
    for _ in range(2):  # a second round where the first batches show a larger request cost
        if size <= batch.active or batch.active >= room:
            break
        batch.grow(max(1, min(size, room)))
        size = max(size, batch_size(single, _incumbent_steps(trusted, incumbent, batch), batch.active))
    return size  # the largest any round asked for: one quiet round cannot shrink the batch


def time_profile(run: Any, plan: TimingPlan) -> None:
    """Time ``run``'s candidate against the incumbent (a :class:`~kernelslot.verify.single.pipeline.ProfileRun`)
    and record the figures in ``run.result.timing``; a check that fails ends the timing."""
    incumbent = run.defn.incumbent_for(run.desc)
    trusted = run.runner.incumbent_runner()
    inc_prepared = None
    if run.defn.slot.needs_prepare:
        try:
            inc_prepared = trusted.prepare(incumbent, run.case.prepare_args)
        except RunnerError as exc:
            run.result.record(Check.RAISED, FAIL, f"timing: the incumbent's prepare failed: {exc}")
            return
    batch = _Batch(run, trusted, inc_prepared)
    traffic: dict[int, Any] = {}
    first: dict[str, CallObservation] = {}
    run.runner.freeze()
    try:
        size = _calibrate(trusted, incumbent, batch)
    except RunnerError as exc:
        run.runner.thaw()
        run.result.record(Check.RAISED, FAIL, f"timing: {exc}")
        return
    trusted.freeze()
    wanted = size
    batch.grow(1)  # the candidate's first warm-up call is a single call: its time caps the batch

    def timed_call(i: int) -> PlannedCall:
        return PlannedCall(TIMED_DRAW + i, "full", plan.poisons[i], pick=plan.picks[i])

    staged: dict[str, StagedBatch] = {}
    timed: dict[str, CallObservation] = {}
    armed: list[tuple[dict, dict]] = []

    def begin(i: int) -> None:
        """Pair ``i``'s inputs, both sides' prologues (inputs read, outputs poisoned) and both batches
        staged, so that nothing but the two timed steps runs between them."""
        batch.refill(i, plan.picks[i])
        traffic[i] = run.defn.traffic(run.ref_case)
        call, n = timed_call(i), batch.active
        armed[:] = [run._arm(call, batch.cases[k], batch.outputs[k]) for k in range(n)]
        batch.poison_incumbent(call)
        trusted.freeze()
        staged["candidate"] = run.runner.stage_batch(run.cand.kernel, batch.args[:n])
        run.runner.freeze()
        staged["incumbent"] = trusted.stage_batch(incumbent, batch.incumbent_args(), check_retention=False)
        trusted.freeze()

    def timed_step(side: str, runner: Runner, other: Runner) -> CallObservation:
        other.freeze()
        runner.run_staged(staged[side])
        runner.freeze()
        timed[side] = CallObservation(elapsed_s=staged[side].elapsed_s / batch.active)  # completed by end()
        return timed[side]

    def end(i: int) -> bool:
        """Both batches reported; the candidate's calls judged (False: one failed a check)."""
        call, n = timed_call(i), batch.active
        trusted.freeze()
        observations, mean = run.runner.finish_batch(staged["candidate"])
        run.runner.freeze()
        for k, obs in enumerate(observations):
            label = "timed call: " if n == 1 else f"timed call ({k + 1} of a batch of {n}): "
            if not run._judge(call, obs, batch.cases[k], batch.refs[k], batch.outputs[k], armed[k], label):
                return False
        if len(observations) < n:  # the worker answered fewer calls than it was given
            run.result.record(Check.RAISED, FAIL, f"timing: the batch stopped after {len(observations)} of {n} calls")
            return False
        first.setdefault("candidate", observations[0])
        _complete(timed["candidate"], observations, mean)
        inc_observations, inc_mean = trusted.finish_batch(staged["incumbent"])
        trusted.freeze()
        _complete(timed["incumbent"], inc_observations, inc_mean)
        if i == 0 and not timed["incumbent"].error:  # after the first warm-up pair: the calibrated size,
            # within what the slower side allows
            batch.grow(min(wanted, batch_cap(first["candidate"], inc_observations[0], batch.set_bytes())))
        return True

    def floor(i: int, fresh: bool) -> roofline.Floor:
        return roofline.floor(traffic[i], run.device, fresh)

    try:
        t = time_interleaved(plan, lambda i: timed_step("candidate", run.runner, trusted),
                             lambda i: timed_step("incumbent", trusted, run.runner), floor, begin, end,
                             lambda: batch.active)
    except RunnerError as exc:
        run.result.record(Check.RAISED, FAIL, f"timing: {exc}")
        return
    finally:
        run.runner.thaw()
        trusted.thaw()
    if t:
        t["batch"] = float(batch.active)
        run.result.timing = t
        run.performed.add(Check.TIME_IMPOSSIBLE)
    if t.get("impossible"):
        run.result.record(Check.TIME_IMPOSSIBLE, FAIL, impossible_message(t))
