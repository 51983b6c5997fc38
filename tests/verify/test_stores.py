"""verify/stores.py: where a call's stores into a padded output landed, named for the kernel author."""
from __future__ import annotations

import torch

from kernelslot.abi import OutputSpec, allocate_output
from kernelslot.isolation.observe import TensorMeta
from kernelslot.verify.stores import changed_cells, store_hint


def padded(shape: tuple[int, ...], policy: str = "padded"):
    alloc = allocate_output(OutputSpec(shape, torch.float32, policy), "cpu")
    alloc.poison()
    return alloc


def test_an_out_reshaped_into_a_copy_is_named():
    """miner_silu_triton: ``out.reshape(-1, d)`` of a 3-D padded out copies; the kernel stores into the copy."""
    alloc = padded((2, 5, 48))
    alloc.view.reshape(-1, 48).fill_(1.0)  # what the launcher wrote: a copy
    assert not changed_cells(alloc).any()
    hint = store_hint("out", alloc, {"x": TensorMeta.of(torch.zeros(2, 5, 96))})
    assert "cannot be viewed as 2-D" in hint and "out.reshape(-1, 48) returns a copy" in hint
    assert f"out.stride() = {tuple(alloc.view.stride())}" in hint and "do not reshape out" in hint


def test_an_out_stored_with_x_strides_is_named():
    """miner_rmsnorm_triton: rows stored at x's (contiguous) row stride, not out's padded one."""
    alloc = padded((13, 100))
    x = torch.randn(13, 100)
    offset = alloc.view.storage_offset()
    alloc.base.as_strided((13, 100), (100, 1), offset).copy_(x)
    assert int(changed_cells(alloc).sum()) == 1300
    hint = store_hint("out", alloc, {"x": TensorMeta.of(x), "weight": TensorMeta.of(torch.ones(100))})
    assert "exactly those of a (13, 100) tensor with x's strides (100, 1), contiguous, at out's offset" in hint
    assert "out.stride() = (103, 1)" in hint and "pass out.stride(0) to the kernel" in hint


def test_other_stores_get_the_general_advice_and_contiguous_outputs_none():
    alloc = padded((4, 10))
    alloc.view[:, :9].fill_(2.0)  # the last column never written: no layout explains it
    assert store_hint("out", alloc, {}) == "out is padded (out.stride() = (13, 1)): store through out.stride(); " \
                                          "do not reshape out or assume contiguous rows"
    untouched = padded((4, 10))
    assert "a copy of it written instead?" in store_hint("out", untouched, {})  # viewable as 2-D: no reshape claim
    assert store_hint("out", padded((4, 10), "contiguous"), {}) == ""
