"""Output tensor specs and the validator's allocation policy.

``padded`` outputs get row strides larger than their logical extent (every dimension but
the first is padded, and the view starts at a non-zero storage offset), so a candidate that
assumes contiguity writes the wrong cells. The padding is filled with a canary so writes
outside the logical view are detected. ``contiguous`` outputs are plain contiguous tensors
placed at a non-zero offset in a canary-filled buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

STRIDE_POLICIES = ("padded", "contiguous")
_LEAD = 16  # elements of canary before the view's first element


@dataclass(frozen=True)
class OutputSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    policy: str = "padded"

    def __post_init__(self) -> None:
        if self.policy not in STRIDE_POLICIES:
            raise ValueError(f"OutputSpec.policy={self.policy!r}; allowed: {STRIDE_POLICIES}")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))


FINITE_POISON = -31337.0  # stored, then compared bit-exactly in the output's dtype


def poison_value(dtype: torch.dtype, finite: bool = False) -> float | int:
    """NaN for floating outputs (or, with ``finite``, a plausible-looking sentinel, so that a
    kernel which behaves differently when it sees NaN in its output is exercised too); the most
    negative integer for integer outputs (-1 is often legal)."""
    if dtype.is_floating_point:
        return FINITE_POISON if finite else float("nan")
    if dtype == torch.bool:
        raise ValueError("bool outputs cannot be poisoned; use an integer dtype")
    return int(torch.iinfo(dtype).min)


def canary_value(dtype: torch.dtype) -> float | int:
    """A plausible value (not the poison) that must survive in the padding around an output."""
    if dtype.is_floating_point:
        return 1234.5 if dtype != torch.float8_e4m3fn else 3.0
    return int(torch.iinfo(dtype).max) - 3


@dataclass
class AllocatedOutput:
    """A validator-owned output: ``view`` is what the candidate gets; ``base`` owns the storage."""

    view: torch.Tensor
    base: torch.Tensor
    mask: torch.Tensor  # bool over ``base``: True where the view lives

    poisoned_finite: bool = False
    poisoned_random: bool = False

    def poison(self, finite: bool = False) -> None:
        self.poisoned_finite, self.poisoned_random = finite, False
        self.view.fill_(poison_value(self.view.dtype, finite))

    def poison_random(self, gen: torch.Generator) -> None:
        """Fill every cell with a different plausible value: nothing for a kernel to recognise.

        Unwritten cells can then no longer be told apart bit-exactly from legitimate results
        (a random bf16 value does collide with a real one now and then), so after this fill
        :meth:`poison_mask` reports nothing and unwritten cells are judged by the comparison.
        """
        v = self.view
        if v.dtype.is_floating_point:
            fill = (torch.randn(v.shape, generator=gen) * 100.0).to(v.dtype)
        else:
            info = torch.iinfo(v.dtype)
            fill = torch.randint(info.min, info.max, v.shape, generator=gen, dtype=torch.int64).to(v.dtype)
        self.poisoned_finite, self.poisoned_random = True, True
        v.copy_(fill)

    def poison_mask(self) -> torch.Tensor:
        """True where the view still holds the poison it was last filled with."""
        v = self.view
        if self.poisoned_random:
            return torch.zeros(v.shape, dtype=torch.bool, device=v.device)
        if v.dtype.is_floating_point and not self.poisoned_finite:
            return torch.isnan(v)
        sentinel = torch.tensor(poison_value(v.dtype, self.poisoned_finite), dtype=v.dtype, device=v.device)
        return v == sentinel

    def canary_intact(self) -> bool:
        outside = self.base[~self.mask]
        expected = canary_value(self.base.dtype)
        if outside.numel() == 0:
            return True
        return bool((outside == expected).all())


def allocate_output(spec: OutputSpec, device: torch.device | str) -> AllocatedOutput:
    """Allocate ``spec`` inside a canary-filled buffer according to its stride policy."""
    shape = spec.shape
    if spec.policy == "padded" and len(shape) >= 1:
        # pad every dim but the first; inner-most by an odd amount so rows are misaligned too
        padded = [shape[0]] + [s + (3 if i == len(shape) - 2 else 1) for i, s in enumerate(shape[1:])]
        if len(shape) == 1:
            padded = [shape[0]]
    else:
        padded = list(shape)
    strides = []
    acc = 1
    for extent in reversed(padded):
        strides.append(acc)
        acc *= max(extent, 1)
    strides.reverse()
    if spec.policy == "padded" and len(shape) == 1:
        strides = [2]  # a 1-D padded output is strided by 2
        acc = 2 * max(shape[0], 1)
    total = _LEAD + acc + _LEAD
    base = torch.full((total,), canary_value(spec.dtype), dtype=spec.dtype, device=device)
    view = base.as_strided(shape, strides, _LEAD)
    mask = torch.zeros(total, dtype=torch.bool, device=device)
    mask.as_strided(shape, strides, _LEAD).fill_(True)
    return AllocatedOutput(view=view, base=base, mask=mask)


def allocate_plain(spec: OutputSpec, device: torch.device | str) -> AllocatedOutput:
    """A plain contiguous output at storage offset 0, as an engine would pass (no canary possible)."""
    view = torch.empty(spec.shape, dtype=spec.dtype, device=device)
    base = view.view(-1)
    return AllocatedOutput(view=view, base=base, mask=torch.ones(base.shape, dtype=torch.bool, device=device))
