"""The runner boundary: where candidate code executes.

The referee owns inputs, outputs, references, comparators and timers; a runner only loads a
candidate, runs its ``prepare`` and calls its ``entry``, and reports what it observed *where
the call ran* (:class:`CallObservation`): a non-None return value, an exception or crash, the
metadata of every tensor argument after the call, and which arguments the candidate retained.
Every check is then made by the referee from that observation and the shared tensors, so the
checks do not care which runner ran the call.
"""
from __future__ import annotations

import contextlib
import gc
import time
import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from kernelslot.bundle.loader import CandidateLoadError, resolve_kernel
from kernelslot.isolation import numeric_state
from kernelslot.isolation.observe import TensorMeta, short_repr, storage_use_count
from kernelslot.isolation.scratch import poisoned_scratch
from kernelslot.slots.base import Kernel


@dataclass
class CallObservation:
    returned: str | None = None  # repr of a non-None return value
    error: str | None = None  # traceback or crash cause
    elapsed_s: float = 0.0  # measured by the referee around the call (a worker's IPC included)
    meta_after: list[TensorMeta | None] = field(default_factory=list)  # per argument, in slot order
    retained: list[int] = field(default_factory=list)  # argument positions whose storage gained a reference
    cause: str | None = None  # with ``error``: exception, timeout, crash, exit, out_of_memory, ... (see isolation/worker.py)
    worker_s: float | None = None  # in-worker time of the entry alone (WorkerRunner only; advisory)
    aot_evidence: list[str] = field(default_factory=list)  # sealed direct artifacts: aot_loaded / aot_invoked / completed
    state_changed: list[str] = field(default_factory=list)  # process-wide numeric state the call changed (isolation/numeric_state.py)


def judge_direct_evidence(kernel: Kernel, obs: CallObservation) -> None:
    """A sealed direct artifact's call counts only with its AOT evidence (bundle/direct/launcher.py)."""
    source = kernel.source
    if source is None or source.sealed is None or obs.error is not None:
        return
    from kernelslot.bundle.direct import evidence_problem

    problem = evidence_problem(obs.aot_evidence)
    if problem:
        obs.error, obs.cause = f"{problem}\n[no_aot_evidence] {problem}", "no_aot_evidence"


@dataclass
class StagedBatch:
    """A batch between :meth:`Runner.stage_batch` and :meth:`Runner.finish_batch`; ``error``: the
    observation that ended it early (staging or the run failed), which ``finish_batch`` reports."""

    kernel: Kernel
    batch: Sequence[Sequence[Any]]
    check_retention: bool
    elapsed_s: float = 0.0  # the timed step's time on the referee's clock, whole batch
    error: CallObservation | None = None
    state_changed: list[str] = field(default_factory=list)  # numeric state the run changed (a worker's report)
    state: Any = None  # the runner's own: a worker process, or the in-process entry
    observations: list[CallObservation] = field(default_factory=list)  # in-process: the run's calls


class RunnerError(RuntimeError):
    """The candidate could not be loaded or prepared (the message says why); ``check`` names the failure."""

    check = "prepare"  # a Check name (kernelslot.verify.verdict); isolation never imports the referee


class GlobalStateChanged(RunnerError):
    """Loading or preparing the candidate changed process-wide numeric state (it was put back)."""

    check = "global_state_changed"  # a Check name


def state_changed_text(changes: Sequence[str], unrestored: Sequence[str] = ()) -> str:
    """The failure message of ``global_state_changed``."""
    text = "candidate code changed process-wide numeric state and left it changed: " + "; ".join(changes)
    return text + (f" (could not be put back: {', '.join(unrestored)})" if unrestored else " (put back)")


class Runner(ABC):
    """Executes candidate code. Implementations: :class:`InProcessRunner`, ``WorkerRunner``."""

    name = "runner"
    in_process = False  # True when candidate code runs in the referee's own process

    def share(self, obj: Any) -> Any:
        """Make the tensors in ``obj`` visible to where candidates run; call before recording identities.

        In place (tensor objects and views keep working); returns ``obj``. A no-op in-process.
        """
        return obj

    def unavailable(self, kernel: Kernel) -> str | None:
        """Why ``kernel`` will not be run any more (e.g. it failed to load once), else None."""
        return None

    def incumbent_runner(self) -> "Runner":
        """Where the incumbent is timed next to a candidate, under the same call path."""
        return InProcessRunner()

    @abstractmethod
    def prepare(self, kernel: Kernel, prepare_args: Sequence[Any]) -> Any:
        """Run ``kernel.prepare(*prepare_args)`` and return a handle to the prepared object."""

    @abstractmethod
    def call(self, kernel: Kernel, args: Sequence[Any], *, check_retention: bool = True, private: bool = False,
             scratch: bool = False) -> CallObservation:
        """Call ``kernel.entry(*args)``; the PREPARED position holds what :meth:`prepare` returned.

        ``private``: hand the candidate private, non-shared copies of the tensor arguments and copy
        them back after the call (a no-op where nothing is shared, i.e. in-process). ``scratch``:
        fill the freed memory of the allocators where the call runs with poison right before it
        (``isolation/scratch.py``), so scratch the candidate reads without writing holds garbage.
        """

    def call_batch(self, kernel: Kernel, batch: Sequence[Sequence[Any]], *, check_retention: bool = True
                   ) -> tuple[list[CallObservation], float]:
        """Call ``kernel.entry`` once per argument list of ``batch``, back to back in one request to
        where candidates run (the timed calls: one round trip's cost spread over many calls).

        Every call is observed as by :meth:`call` (its ``worker_s`` where the runner measures one);
        the second value is the batch's time on the referee's clock divided by ``len(batch)``. The
        batch stops at the first call that raises; the observations then end there. The three steps
        (:meth:`stage_batch`, :meth:`run_staged`, :meth:`finish_batch`) may also be made apart, so the
        timed step of two runners' batches can run back to back.
        """
        staged = self.stage_batch(kernel, batch, check_retention=check_retention)
        self.run_staged(staged)
        return self.finish_batch(staged)

    @abstractmethod
    def stage_batch(self, kernel: Kernel, batch: Sequence[Sequence[Any]], *, check_retention: bool = True) -> "StagedBatch":
        """Hand ``batch`` to where candidates run without calling anything (untimed)."""

    @abstractmethod
    def run_staged(self, staged: "StagedBatch") -> None:
        """Make the staged calls back to back and nothing else; sets ``staged.elapsed_s`` (the timed step)."""

    @abstractmethod
    def finish_batch(self, staged: "StagedBatch") -> tuple[list[CallObservation], float]:
        """What :meth:`call_batch` returns for ``staged``, once :meth:`run_staged` made its calls (untimed)."""

    def freeze(self) -> None:
        """Stop every process where this runner runs candidate code, so none of it runs while
        another runner's calls are timed (a no-op where candidate code runs in this process)."""

    def thaw(self) -> None:
        """Resume what :meth:`freeze` stopped (a no-op when nothing is stopped)."""

    def close(self) -> None:
        """Release resources (worker processes)."""


class InProcessRunner(Runner):
    """Runs the candidate in the referee's own process: fast and debuggable, not isolated."""

    name = "in-process"
    in_process = True

    def __init__(self) -> None:
        self._resolved: dict[Kernel, tuple[Callable, Callable | None]] = {}

    def _callables(self, kernel: Kernel) -> tuple[Callable, Callable | None]:
        key = kernel
        if key not in self._resolved:
            try:
                self._resolved[key] = resolve_kernel(kernel)
            except CandidateLoadError as exc:
                raise RunnerError(str(exc)) from None
        return self._resolved[key]

    def prepare(self, kernel: Kernel, prepare_args: Sequence[Any]) -> Any:
        with numeric_state.Guard() as guard:
            _, prepare = self._callables(kernel)
            if prepare is None:
                raise RunnerError(f"{kernel.name}: the slot needs prepare() but the kernel has none")
            try:
                prepared = prepare(*prepare_args)
            except Exception:
                raise RunnerError("prepare() raised:\n" + traceback.format_exc(limit=6)) from None
        if guard.changed:
            raise GlobalStateChanged("prepare(): " + state_changed_text(guard.changed, guard.unrestored))
        return prepared

    def call(self, kernel: Kernel, args: Sequence[Any], *, check_retention: bool = True, private: bool = False,
             scratch: bool = False) -> CallObservation:
        obs = CallObservation()
        with numeric_state.Guard() as guard:
            try:
                entry, _ = self._callables(kernel)
            except RunnerError as exc:
                obs.error = str(exc)
                return obs
            self._call_one(kernel, entry, args, check_retention, scratch, obs)
        obs.state_changed = [state_changed_text(guard.changed, guard.unrestored)] if guard.changed else []
        return obs

    def stage_batch(self, kernel: Kernel, batch: Sequence[Sequence[Any]], *, check_retention: bool = True) -> StagedBatch:
        staged = StagedBatch(kernel, batch, check_retention)
        try:
            staged.state = self._callables(kernel)[0]
        except RunnerError as exc:
            staged.error = CallObservation(error=str(exc))
        return staged

    def run_staged(self, staged: StagedBatch) -> None:
        if staged.error is not None:
            return
        entry, observations = staged.state, staged.observations
        with numeric_state.Guard() as guard:
            for args in staged.batch:
                obs = self._call_one(staged.kernel, entry, args, staged.check_retention, False, CallObservation())
                observations.append(obs)
                if obs.error:
                    break
        changed = [state_changed_text(guard.changed, guard.unrestored)] if guard.changed else []
        for obs in observations:
            obs.state_changed = changed
        staged.elapsed_s = sum(o.elapsed_s for o in observations)  # the entries' own time: no round trip here

    def finish_batch(self, staged: StagedBatch) -> tuple[list[CallObservation], float]:
        if staged.error is not None:
            return [staged.error], 0.0
        return staged.observations, staged.elapsed_s / max(1, len(staged.observations))

    @staticmethod
    def _call_one(kernel: Kernel, entry: Callable, args: Sequence[Any], check_retention: bool, scratch: bool,
                  obs: CallObservation) -> CallObservation:
        """One call of ``entry`` and what it left (``elapsed_s``: the entry's own time)."""
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        before = {i: storage_use_count(t) for i, t in tensors} if check_retention else {}
        start = time.perf_counter()
        try:
            with poisoned_scratch() if scratch else contextlib.nullcontext():
                result = entry(*args)
            if result is not None:
                obs.returned = short_repr(result)
            del result
        except Exception:
            obs.error, obs.cause = traceback.format_exc(limit=8), "exception"
        if args and isinstance(args[0], torch.Tensor) and args[0].is_cuda:
            torch.cuda.synchronize()
        obs.elapsed_s = time.perf_counter() - start
        obs.aot_evidence = list(getattr(entry, "take_evidence", list)())
        judge_direct_evidence(kernel, obs)
        obs.meta_after = [TensorMeta.of(a) if isinstance(a, torch.Tensor) else None for a in args]
        if check_retention:
            obs.retained = [i for i, t in tensors if storage_use_count(t) > before[i]]
            if obs.retained:  # a reference cycle may still hold a view: collect, then look again
                gc.collect()
                obs.retained = [i for i, t in tensors if storage_use_count(t) > before[i]]
        return obs
