"""Where a call's stores into a padded output landed, said in terms a kernel author acts on.

Every strided output is allocated inside a canary-filled buffer with padded strides and poisoned
before each call (``abi/tensor_spec.py``). When a call leaves cells poisoned (``poison_left``) or
changes the padding (``out_of_bounds_write``), :func:`store_hint` compares the cells it changed
with the layouts kernels commonly store with by mistake (a Triton launch passing the wrong
strides, a host wrapper that reshapes ``out``):

* nothing changed while the output cannot be viewed as 2-D: ``out.reshape(-1, N)`` returned a
  copy, and the kernel stored into the copy;
* exactly the cells of a tensor of the output's shape with other strides (an input's, or
  contiguous ones): the kernel indexed the output with those strides instead of its own.

Only cells inside the buffer can be read back, so a layout reaching past it is never claimed.
"""
from __future__ import annotations

from typing import Mapping

import torch

from kernelslot.abi import AllocatedOutput
from kernelslot.abi.tensor_spec import canary_value
from kernelslot.isolation.observe import TensorMeta

__all__ = ["changed_cells", "store_hint"]


def changed_cells(alloc: AllocatedOutput) -> torch.Tensor:
    """Bool over ``alloc.base`` (on the CPU): True where the call stored, i.e. a view cell no longer
    holds its poison or a padding cell no longer holds the canary."""
    base, view = alloc.base.detach().cpu(), alloc.view.detach().cpu()
    changed = base != torch.tensor(canary_value(base.dtype), dtype=base.dtype)
    changed &= ~alloc.mask.cpu()
    changed[_positions(base.numel(), tuple(view.shape), tuple(view.stride()), _offset(alloc))[~alloc.poison_mask().cpu()]] = True
    return changed


def _offset(alloc: AllocatedOutput) -> int:
    return alloc.view.storage_offset() - alloc.base.storage_offset()


def _positions(total: int, shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> torch.Tensor:
    """The buffer index of every cell of a ``shape`` tensor with ``stride`` at ``offset``."""
    return torch.arange(total).as_strided(shape, stride, offset)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= max(extent, 1)
    return tuple(reversed(strides))


def _layouts(shape: tuple[int, ...], inputs: Mapping[str, TensorMeta]) -> list[tuple[tuple[int, ...], str]]:
    """Strides a kernel may have stored an output of ``shape`` with, each with what they are
    (``x's strides (1000, 1), contiguous``)."""
    found: dict[tuple[int, ...], list[str]] = {}
    for name, meta in inputs.items():
        if len(meta.stride) == len(shape):
            found.setdefault(tuple(meta.stride), []).append(name)
    contiguous = _contiguous(shape)
    found.setdefault(contiguous, [])
    return [(stride, (f"{' and '.join(names)}'s strides {stride}" if names else f"strides {stride}")
             + (", contiguous" if stride == contiguous else "")) for stride, names in found.items()]


def store_hint(name: str, alloc: AllocatedOutput, inputs: Mapping[str, TensorMeta]) -> str:
    """What the cells a call changed in output ``name`` say about how it stored ('' when nothing
    recognisable, or the output is not padded)."""
    view = alloc.view
    shape, stride = tuple(view.shape), tuple(view.stride())
    if view.is_contiguous() or view.numel() == 0:
        return ""
    changed = changed_cells(alloc)
    own = f"{name}.stride() = {stride}"
    if not changed.any():
        if view.dim() > 2 and not _viewable_2d(view):
            return (f"nothing was stored into {name}: {name} {shape} with strides {stride} cannot be viewed as 2-D, so "
                    f"{name}.reshape(-1, {shape[-1]}) returns a copy and the kernel stored into the copy; do not reshape "
                    f"{name}: store through {own} (every dimension), or launch over its leading dimensions")
        return (f"nothing was stored into {name}: a copy of it written instead? ({name}.contiguous(), .reshape() or "
                f".to() copy a padded tensor); store through {own}")
    for strides, whose in _layouts(shape, inputs):
        if strides == stride:
            continue
        last = _offset(alloc) + sum((n - 1) * s for n, s in zip(shape, strides))
        if last < changed.numel():
            hit = torch.zeros_like(changed)
            hit[_positions(changed.numel(), shape, strides, _offset(alloc))] = True
            if torch.equal(hit, changed):
                return (f"the cells stored are exactly those of a {shape} tensor with {whose}, at {name}'s offset: "
                        f"the kernel indexed {name} with those strides; index it with its own, {own} "
                        f"(pass {name}.stride(0) to the kernel as its row stride)")
    return f"{name} is padded ({own}): store through {name}.stride(); do not reshape {name} or assume contiguous rows"


def _viewable_2d(view: torch.Tensor) -> bool:
    try:
        view.view(-1, view.shape[-1])
    except RuntimeError:
        return False
    return True
