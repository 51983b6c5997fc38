"""Shared fixtures for the transformers-engine tests (random weights, no download)."""
from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("transformers")

BUNDLES = __import__("pathlib").Path(__file__).parent / "bundles"


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def prompts(vocab: int, n: int = 2, length: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed))


def logits_of(model, ids: torch.Tensor, steps: int = 3) -> torch.Tensor:
    """Prefill + ``steps`` greedy decode steps; every position's logits, concatenated."""
    from kernelslot.engines.e2e import run_trace

    return run_trace(model, ids, steps).logits
