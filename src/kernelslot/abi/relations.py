"""Metamorphic relations: what a slot's semantics guarantee between two calls of one kernel.

A relation transforms the inputs of a call and says how the outputs must transform with them.
The referee (``verify/plan.py``, step ``relation``) takes the inputs of a call the candidate has
just made, writes the transformed values into the same storages, calls again and requires the new
outputs to equal the old outputs transformed, within the slot's comparator (check
``metamorphic``). Every such call is compared with the reference as well.

Conventions: inputs and outputs are CPU tensors keyed by argument name; the transformation's
parameters (a permutation, a factor) are drawn from a ``random.Random`` the referee owns.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

import torch

Tensors = Mapping[str, torch.Tensor]


class Relation(Protocol):
    def describe(self) -> str: ...

    def transform(self, inputs: Tensors, rng: random.Random) -> tuple[dict[str, torch.Tensor], Callable[[Tensors], dict[str, torch.Tensor]], str]:
        """(the transformed inputs that change, the same transformation of the outputs, a note of the draw)."""
        ...


@dataclass(frozen=True)
class PermuteTokens:
    """Token-wise semantics: permuting axis 0 of ``inputs`` permutes axis 0 of ``outputs`` the same way."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def describe(self) -> str:
        return (f"permuting the tokens (axis 0) of {', '.join(self.inputs)} permutes axis 0 of "
                f"{', '.join(self.outputs)} the same way")

    def transform(self, inputs: Tensors, rng: random.Random) -> tuple[dict[str, torch.Tensor], Callable[[Tensors], dict[str, torch.Tensor]], str]:
        n = inputs[self.inputs[0]].shape[0]
        order = list(range(n))
        while n > 1 and order == sorted(order):  # never the identity where another order exists
            rng.shuffle(order)
        perm = torch.tensor(order, dtype=torch.long)
        moved = {name: inputs[name][perm].clone() for name in self.inputs}
        return moved, (lambda outs: {name: outs[name][perm] for name in self.outputs}), f"permutation {order[:8]}{'…' if n > 8 else ''}"


@dataclass(frozen=True)
class ScaleLinear:
    """Linearity in one input: scaling ``input`` by ``c`` scales ``outputs`` by ``c`` (``c`` drawn
    log-uniformly in [1/max_factor, max_factor], at least a factor 1.5 away from 1)."""

    input: str
    outputs: tuple[str, ...]
    max_factor: float = 16.0

    def describe(self) -> str:
        return (f"scaling {self.input} by c (drawn in [1/{self.max_factor:g}, {self.max_factor:g}]) scales "
                f"{', '.join(self.outputs)} by c")

    def transform(self, inputs: Tensors, rng: random.Random) -> tuple[dict[str, torch.Tensor], Callable[[Tensors], dict[str, torch.Tensor]], str]:
        span = math.log2(self.max_factor)
        exponent = rng.uniform(math.log2(1.5), span) * rng.choice((-1, 1))
        c = 2.0 ** exponent
        x = inputs[self.input]
        scaled = (x.double() * c).to(x.dtype)
        return {self.input: scaled}, (lambda outs: {name: outs[name].double() * c for name in self.outputs}), f"c = {c:.4g}"
