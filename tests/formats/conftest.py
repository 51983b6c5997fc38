"""Shared helpers for the formats tests: the torchao reference (CPU emulation paths) and
seeded generators."""
from __future__ import annotations

import warnings

import pytest
import torch


@pytest.fixture(scope="session")
def torchao_mx():
    """torchao.prototype.mx_formats modules (the independent implementation we match)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("torchao")
        from torchao.prototype.mx_formats import kernels, mx_tensor, nvfp4_tensor, utils
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
    return {
        "kernels": kernels,
        "mx_tensor": mx_tensor,
        "nvfp4_tensor": nvfp4_tensor,
        "utils": utils,
        "ScaleCalculationMode": ScaleCalculationMode,
    }


def _wide_range_randn(*shape: int, seed: int, spread: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    spread = torch.exp2(torch.randint(-spread, spread + 1, (*shape[:-1], shape[-1] // 16, 1), generator=g))
    return (x.reshape(*shape[:-1], shape[-1] // 16, 16) * spread).reshape(shape)


@pytest.fixture
def wide_randn():
    """``wide_randn(*shape, seed=..., spread=12)``: normal values scaled by 2^k, k uniform in
    [-spread, spread] per 16-element group, so block scales cover many exponents."""
    return _wide_range_randn
