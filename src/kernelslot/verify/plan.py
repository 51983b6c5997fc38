"""The call plan: which calls the referee makes for one profile × seed, and how each is dressed.

One object, consumed by the single-device pipeline (``verify/single/pipeline.py``) and meant for the
collective referee too, so that hardening the schedule hardens both. Nothing here touches a
candidate: a plan is data, drawn by a :class:`Planner` from the referee's own RNG (secret unless
``plan_seed`` is given, e.g. by tests).

A :class:`CallPlan` is a sequence of :class:`PlannedCall` steps:

- step 0 is the case as generated (``refill="first"``), on padded, canaried, NaN-poisoned outputs;
- ``replays`` base replays cycle through :data:`BASE_REFILLS` (tail, head, then row or cells at
  random); the first one is poisoned with the finite sentinel, the others with NaN;
- a geometric number of extra replays (``P(extra >= k) = q^k`` with ``q = m / (1 + m)`` for mean
  ``m``; unbounded), each with a random refill kind and a random poison kind;
- one engine-like call (``plain=True``): plain contiguous outputs at offset 0, every cell filled
  with a random value (``poison="random"``), on a full refill, with private tensors. It sits at a
  random position among the replays, so "the last call" is not recognisable either.

``private=True`` asks the runner to hand the candidate private, non-shared copies of every tensor
argument and copy them back after the call (the worker runner; a no-op in-process, where nothing
is shared). The plain call is private; each extra replay is private with probability 1/2.

Refill kinds (:func:`refill_inputs`), applied to the live inputs (same storages, fresh values):
``full`` redraws every live input; ``tail`` / ``head`` redraw the trailing / leading half (memory
order) of every floating-point live input; ``row`` rewrites one random row (first dimension) of one
random floating-point live input, ``cells`` 1-3 random cells of one, with values taken from other
random positions of that input. Integer inputs (ids, lengths, page tables) are kept by every
partial kind, so a case's invariants hold.

Timing (:class:`TimingPlan`) draws the warm-up and repetition counts per profile; every warm-up
and timed call is refilled, poisoned and checked outside the timed window like any replay.

Profiles and replays are interleaved: :meth:`Planner.pick` chooses which live profile run makes
its next call, uniformly at random, so the calls of one signature are spread among others.

The long run (issue 26; ``long_run=(low, high)``, on for bundles: :data:`BUNDLE_LONG_RUN`): per slot
verification, :meth:`Planner.lengthen_one` gives one profile run, drawn uniformly among those the
candidate's domain admits, ``L`` more extra replays, ``L`` log-uniform in ``[low, high]``
(:func:`log_uniform`: ``P(L >= k) = ln((high+1)/k) / ln((high+1)/low)``, every doubling of ``k``
about equally likely up to the cap). Its replays are drawn like the other extra replays and its plain
call and state steps are placed again among all of them, so it is a plan with more extra replays,
nothing else: no call of it is marked, and its calls interleave with the others' as every run's do.
A kernel honest for its first ``N`` calls of a signature is caught whenever that run makes more than
``N`` calls, i.e. surely for ``N < 5 + S + low`` and with probability ``P(X + L >= N - 4 - S)`` beyond.

State steps (issue 18; :meth:`Planner.plan` adds them only when asked, so the collective referee,
which does not consume them yet, gets none), each at a random position among the replays:

- ``reprepare`` (slots with ``prepare``): the weights of a fresh draw are written *into the same
  storages* (a weight reload in place: same data pointers and shapes, new values), the live inputs
  are redrawn from the same draw, ``prepare`` runs again and the call uses its new result, so a
  prepared layout cached on weight addresses or shapes serves stale weights (check ``reprepare``);
- ``repeat``: the previous call again, on the same inputs, right after the runner filled the freed
  memory of its allocators with poison (``scratch=True``); the outputs must be bitwise equal to the
  previous call's (check ``determinism``): a kernel that reads uninitialised scratch fails. Extra
  replays poison the scratch too, each with probability 1/2, so recognising the repeat (its inputs
  did not change) does not make reading unwritten scratch safe;
- ``relation`` (one per metamorphic relation the slot declares, ``relation`` its index): the
  previous call's inputs transformed by the relation (tokens permuted, routing weights scaled), in
  place; the outputs must be the previous outputs transformed the same way, within the slot's
  comparator (check ``metamorphic``).

Adding a step kind means a new ``refill`` kind or a new field with a default on
:class:`PlannedCall`, consumed by the pipeline's one call loop; the sequence and its consumers keep
their shape.

Collective use: draw one plan per profile × seed with :meth:`Planner.plan` and send every rank the
same steps; refill each rank's share with :func:`refill_inputs` using the step's ``pick``, so every
rank changes the same positions of its own inputs.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

BASE_REFILLS = ("tail", "head", "sparse")  # "sparse": row or cells, drawn per replay
SPARSE = ("row", "cells")
REFILLS = ("full", "tail", "head", "row", "cells")
POISONS = ("nan", "sentinel")  # padded outputs; plain outputs get "random"
PLAIN_DRAW = 500  # fresh-values draw id of the plain call (kept clear of replay draw ids)
STEP_DRAW = 600  # draw ids of the state steps (reprepare, repeat, relation) start here
STATE_STEPS = ("reprepare", "repeat", "relation")
SCRATCH_P = 0.5  # the probability that an extra replay also runs on poisoned scratch (where a repeat is planned)
TIMED_DRAW = 10_000  # draw ids of warm-up and timed calls start here
LONG_DRAW = 2000  # draw ids of the long run's replays start here (clear of the plain call's and the steps')
BUNDLE_LONG_RUN = (16, 256)  # the long run's length range for untrusted bundles (cli.py, engines/qualify.py)


@dataclass(frozen=True)
class PlannedCall:
    """One call: how its inputs are refilled and its outputs dressed.

    ``draw`` is the call id the fresh values come from (``make_case(profile, seed, draw)``);
    ``pick`` seeds the random positions of a ``row`` / ``cells`` refill.
    """

    draw: int
    refill: str  # "first" (step 0) or one of REFILLS
    poison: str  # "nan", "sentinel" or "random" (plain outputs)
    plain: bool = False
    private: bool = False
    pick: int = 0
    scratch: bool = False  # the runner poisons its allocators' freed memory right before the call
    relation: int = 0  # a "relation" step: which of the slot's metamorphic relations
    graph: str | None = None  # "capture" / "replay": a CUDA-graph step (the collective referee's ranks)

    @property
    def label(self) -> str:
        if self.graph:
            return f"graph {self.graph}: "
        if self.plain:
            return "plain-output call: "
        if self.refill == "reprepare":
            return "re-prepared call (weights reloaded in place): "
        if self.refill == "repeat":
            return "repeated call on poisoned scratch: "
        if self.refill == "relation":
            return f"metamorphic call (relation {self.relation}): "
        return f"replay {self.draw} ({self.refill} refill): " if self.draw else ""


MORE_REPS = 8  # a timing plan has room for this many times its least repetitions (verify/single/timing.py)


@dataclass(frozen=True)
class TimingPlan:
    """``warmup`` discarded candidate/incumbent pairs, then ``reps`` timed ones (alternating which side goes first)."""

    warmup: int
    reps: int
    poisons: tuple[str, ...]  # per call of the sequence (warm-ups first; room for MORE_REPS times ``reps`` timed pairs)
    picks: tuple[int, ...]


@dataclass(frozen=True)
class CallPlan:
    calls: tuple[PlannedCall, ...]
    timing: TimingPlan | None = None

    def describe(self) -> str:
        kinds = ", ".join(("plain" if c.plain else c.refill) + ("*" if c.private else "") + ("~" if c.scratch else "")
                          for c in self.calls)
        timed = f"; timed {self.timing.warmup}+{self.timing.reps}" if self.timing else ""
        return f"{len(self.calls)} calls ({kinds}){timed}"


def geometric(rng: random.Random, mean: float) -> int:
    """A draw with ``P(X >= k) = q^k``, ``q = mean / (1 + mean)`` (unbounded, mean ``mean``)."""
    q = mean / (1.0 + mean) if mean > 0 else 0.0
    k = 0
    while rng.random() < q:
        k += 1
    return k


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    """An integer in ``[low, high]`` with ``P(X >= k) = ln((high + 1) / k) / ln((high + 1) / low)`` for
    ``low <= k <= high + 1`` (``floor(low · ((high + 1) / low)^U)``, U uniform in [0, 1))."""
    return min(high, int(low * math.exp(rng.random() * math.log((high + 1) / low))))


class Planner:
    """Draws call plans. ``replays``: base replays (>= 2); ``extra_mean``: mean of the geometric
    number of extra replays; ``time_reps``: the least number of timed repetitions (None: no timing);
    ``long_run``: ``(low, high)`` of the long run's extra replays (:meth:`lengthen_one`; None: none)."""

    def __init__(self, replays: int = 3, extra_mean: float = 0.25, time_reps: int | None = None,
                 plan_seed: int | None = None, long_run: tuple[int, int] | None = None):
        if long_run is not None and not 1 <= long_run[0] <= long_run[1] <= TIMED_DRAW - LONG_DRAW:
            raise ValueError(f"long_run must be (low, high) with 1 <= low <= high <= {TIMED_DRAW - LONG_DRAW}, got {long_run}")
        self.replays, self.extra_mean, self.time_reps, self.long_run = replays, extra_mean, time_reps, long_run
        self.rng: random.Random = random.Random(plan_seed) if plan_seed is not None else random.SystemRandom()

    def plan(self, reprepare: bool = False, repeat: bool = False, relations: int = 0) -> CallPlan:
        """One plan; the state steps (module docstring) only where asked: ``reprepare`` for slots with
        ``prepare``, ``repeat``, and one ``relation`` step per metamorphic relation of the slot."""
        rng = self.rng
        kinds = [BASE_REFILLS[i % len(BASE_REFILLS)] for i in range(self.replays)]
        kinds = [rng.choice(SPARSE) if k == "sparse" else k for k in kinds]
        scratch = repeat  # where the repeat exists, the runner can poison scratch: other replays get it at random too
        replays = [PlannedCall(i + 1, kind, "sentinel" if i == 0 else "nan", pick=rng.getrandbits(63))
                   for i, kind in enumerate(kinds)]
        for i in range(geometric(rng, self.extra_mean)):
            replays.append(PlannedCall(len(replays) + 1, rng.choice(REFILLS), rng.choice(POISONS),
                                       private=rng.random() < 0.5, pick=rng.getrandbits(63),
                                       scratch=scratch and rng.random() < SCRATCH_P))
        plain = PlannedCall(PLAIN_DRAW, "full", "random", plain=True, private=True, pick=rng.getrandbits(63))
        replays.insert(rng.randint(1, len(replays)), plain)  # never before the first replay (it must see poison)
        steps = (["reprepare"] if reprepare else []) + (["repeat"] if repeat else []) + ["relation"] * relations
        for i, kind in enumerate(steps):
            step = PlannedCall(STEP_DRAW + i, kind, rng.choice(POISONS), pick=rng.getrandbits(63), scratch=kind == "repeat",
                               relation=steps[:i].count("relation"))
            replays.insert(rng.randint(0, len(replays)), step)
        timing = None
        if self.time_reps is not None:
            warmup, reps = rng.randint(1, 4), self.time_reps + rng.randint(0, max(1, self.time_reps // 2))
            n = warmup + MORE_REPS * reps  # verify/single/timing.py adds pairs where the incumbent is fast
            timing = TimingPlan(warmup, reps, tuple(rng.choice(POISONS) for _ in range(n)),
                                tuple(rng.getrandbits(63) for _ in range(n)))
        return CallPlan((PlannedCall(0, "first", "nan"), *replays), timing)

    def lengthen_one(self, plans: Sequence[CallPlan], admitted: Callable[[int], bool]) -> tuple[int, CallPlan] | None:
        """With ``long_run``: the index of one of ``plans``, drawn uniformly among those ``admitted(index)``
        accepts (asked in a random order, only until one does), and that plan with
        :func:`log_uniform` ``(*long_run)`` more extra replays (:meth:`lengthened`); else None."""
        drawn = self.draw_long_run(len(plans), admitted)
        return None if drawn is None else (drawn[0], self.lengthened(plans[drawn[0]], drawn[1]))

    def draw_long_run(self, runs: int, admitted: Callable[[int], bool]) -> tuple[int, int] | None:
        """With ``long_run``: which of ``runs`` profile runs is the long one (uniformly among those
        ``admitted(index)`` accepts, asked in a random order only until one does) and how many extra
        replays it gets (:func:`log_uniform` ``(*long_run)``); else None."""
        if self.long_run is None:
            return None
        order = list(range(runs))
        self.rng.shuffle(order)
        chosen = next((i for i in order if admitted(i)), None)
        return None if chosen is None else (chosen, log_uniform(self.rng, *self.long_run))

    def lengthened(self, plan: CallPlan, more: int) -> CallPlan:
        """``plan`` with ``more`` extra replays, drawn as :meth:`plan` draws them (draw ids from
        :data:`LONG_DRAW`), and its plain call and state steps placed again among all the replays as
        :meth:`plan` places them: the distribution of a plan with that many more extra replays."""
        rng = self.rng
        first, rest = plan.calls[0], plan.calls[1:]
        markers = sorted((c for c in rest if c.plain or c.refill in STATE_STEPS), key=lambda c: (not c.plain, c.draw))
        replays = [c for c in rest if not (c.plain or c.refill in STATE_STEPS)]
        scratch = any(c.refill == "repeat" for c in markers)
        replays += [PlannedCall(LONG_DRAW + i, rng.choice(REFILLS), rng.choice(POISONS), private=rng.random() < 0.5,
                                pick=rng.getrandbits(63), scratch=scratch and rng.random() < SCRATCH_P) for i in range(more)]
        for call in markers:
            replays.insert(rng.randint(1, len(replays)) if call.plain else rng.randint(0, len(replays)), call)
        return replace(plan, calls=(first, *replays))

    def pick(self, alive: Sequence[int]) -> int:
        """Which of the ``alive`` profile runs makes the next call (uniformly at random)."""
        return alive[self.rng.randrange(len(alive))]


def planner_for(opts: Any) -> Planner:
    """The call planner a :class:`~kernelslot.verify.options.VerifyOptions` asks for (one per slot verification)."""
    return Planner(opts.replays, opts.extra_mean, opts.time_reps if opts.time else None, opts.plan_seed,
                   opts.long_run)


def needs_fresh(kind: str) -> bool:
    """Whether refill ``kind`` takes a fresh draw of the inputs (the sparse kinds reuse values already there)."""
    return kind not in SPARSE


def refill_inputs(prev: dict[str, torch.Tensor], kind: str, pick: int = 0,
                  fresh: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The values the live inputs ``prev`` take under refill ``kind``; ``fresh`` is a new draw of them
    (required when :func:`needs_fresh`). CPU tensors in, new CPU tensors out (``prev`` is not modified).

    The sparse kinds write values taken from other random positions of the same input (so they stay
    in its distribution, and no new draw is needed): one row (first dimension), or 1-3 cells.
    """
    if needs_fresh(kind):
        if fresh is None:
            raise ValueError(f"refill {kind!r} needs a fresh draw of the inputs")
        if kind == "full":
            return dict(fresh)
        if kind in ("head", "tail"):
            return {n: refilled(prev[n], fresh[n], kind) for n in prev}
        raise ValueError(f"unknown refill kind {kind!r}")
    floats = sorted(n for n, t in prev.items() if t.dtype.is_floating_point and t.numel() > 1)
    if not floats:
        return dict(prev)
    rng = random.Random(pick)
    name = rng.choice(floats)
    mixed = prev[name].clone().contiguous()
    flat = mixed.view(-1)
    if kind == "row" and mixed.dim() > 1 and mixed.shape[0] > 1:
        row, width = rng.randrange(mixed.shape[0]), flat.numel() // mixed.shape[0]
        cells = range(row * width, (row + 1) * width)
    else:
        cells = rng.sample(range(flat.numel()), min(flat.numel(), rng.randint(1, 3)))
    source = torch.tensor([rng.randrange(flat.numel()) for _ in cells], dtype=torch.long)
    flat[torch.tensor(list(cells), dtype=torch.long)] = prev[name].contiguous().view(-1)[source]
    return {**prev, name: mixed}


def refilled(old: torch.Tensor, new: torch.Tensor, mode: str) -> torch.Tensor:
    """One input under a ``full`` / ``head`` / ``tail`` refill (integer inputs keep ``old`` in the partial ones)."""
    if mode == "full":
        return new
    if not new.dtype.is_floating_point:
        return old
    mixed = old.clone().contiguous()
    half = mixed.numel() // 2
    region = slice(half, None) if mode == "tail" else slice(0, half)
    mixed.view(-1)[region] = new.contiguous().view(-1)[region]
    return mixed
