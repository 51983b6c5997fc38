"""Drawn profiles: extra shapes and structures inside a slot's declared domain, from Hypothesis.

A slot that sets ``SlotDef.draw`` — ``draw(base, pick) -> dims`` — gets ``n`` drawn profiles per
run seed on top of its fixed ones: Hypothesis chooses a base among the profiles the run
selected, and the slot's ``draw`` chooses sizes and structure (routing skew, ties, ragged
lengths) through ``pick`` (:class:`~kernelslot.slots.base.Pick`), keeping the base's dtype,
model, format and every constraint of the contract. A drawn profile is named
``BASE~dI`` and carries its record (``Profile.drawn``: run seed, index, base, dims, Hypothesis
version), which the report logs with the result.

Deterministic by construction: draw ``i`` of slot ``S`` at run seed ``s`` depends only on ``S``,
``s``, the selected bases and the Hypothesis version — ``--seed-base s`` reproduces it. Hypothesis
runs seeded, with no example database, no shrinking, no deadline or health checks, and without
its harvesting of constants from loaded source modules (which would make the draws depend on what
else was imported, and write a cache under ``.hypothesis/``): nothing is written anywhere.
"""
from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Any, Sequence, TypeVar

import hypothesis
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from hypothesis.internal.conjecture import providers
from hypothesis.internal.constants_ast import Constants

from kernelslot.slots.base import Profile, SlotDef

__all__ = ["drawn_profiles", "DRAWN_MARK"]

T = TypeVar("T")
DRAWN_MARK = "~d"  # drawn profile names: BASE~dI


class _NoLocalConstants(providers.HypothesisProvider):
    """Hypothesis's own provider, minus the constants it harvests from loaded local modules."""

    @functools.cached_property
    def _local_constants(self) -> Constants:
        return Constants()


_BACKEND = "kernelslot-seeded"
providers.AVAILABLE_PROVIDERS.setdefault(_BACKEND, f"{__name__}._NoLocalConstants")
_SETTINGS = dict(database=None, phases=[Phase.generate], deadline=None, derandomize=False, print_blob=False,
                 suppress_health_check=list(HealthCheck), backend=_BACKEND)


class _HypothesisPick:
    """:class:`~kernelslot.slots.base.Pick` over one Hypothesis ``data`` object."""

    def __init__(self, data: Any):
        self._data = data

    def integer(self, lo: int, hi: int) -> int:
        return self._data.draw(st.integers(lo, hi))

    def choice(self, options: Sequence[T]) -> T:
        return self._data.draw(st.sampled_from(list(options)))

    def flag(self) -> bool:
        return self._data.draw(st.booleans())

    def integers(self, lo: int, hi: int, min_size: int, max_size: int) -> tuple[int, ...]:
        return tuple(self._data.draw(st.lists(st.integers(lo, hi), min_size=min_size, max_size=max_size)))

    def subset(self, options: Sequence[T]) -> tuple[T, ...]:
        return tuple(o for o in options if self.flag())


def draw_seed(slot: str, seed: int) -> int:
    """The Hypothesis seed of slot ``slot``'s draws at run seed ``seed``."""
    return (zlib.crc32(slot.encode()) * 1_000_003 + seed) % (2**63)


def drawn_profiles(defn: SlotDef, bases: Sequence[Profile], seed: int, n: int) -> list[Profile]:
    """``n`` drawn profiles of ``defn`` at run seed ``seed`` around ``bases`` (none without ``defn.draw``)."""
    if n <= 0 or defn.draw is None or not bases:
        return []
    found: list[tuple[Profile, dict]] = []

    @hypothesis.seed(draw_seed(defn.name, seed))
    @settings(max_examples=n + 1, **_SETTINGS)
    @given(st.data())
    def collect(data: Any) -> None:
        base = data.draw(st.sampled_from(list(bases)))
        found.append((base, dict(defn.draw(base, _HypothesisPick(data)))))

    collect()
    out = []
    for i, (base, dims) in enumerate(found[1:n + 1]):  # the first example is Hypothesis's simplest: every seed's same
        name = f"{base.name}{DRAWN_MARK}{i}"
        record = {"seed": seed, "index": i, "base": base.label, "dims": _plain(dims),
                  "hypothesis": hypothesis.__version__}
        out.append(dataclasses.replace(base, name=name, dims={**base.dims, **dims}, tags=base.tags | {"drawn"},
                                       drawn=record))
    return out


def _plain(dims: dict) -> dict:
    """``dims`` with the values JSON can hold (tuples as lists; enums and other objects as strings)."""
    def one(v: Any) -> Any:
        if isinstance(v, (bool, int, float, str)) or v is None:
            return v
        if isinstance(v, (tuple, list)):
            return [one(x) for x in v]
        return str(v)
    return {k: one(v) for k, v in dims.items()}
