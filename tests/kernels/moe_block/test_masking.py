"""Affinity masking: the rank slice, the index mask, and the keystone that gates it."""
from __future__ import annotations

import itertools

import pytest
import torch

from kernelslot.kernels.moe_block.config import MoeBlockConfig
from kernelslot.kernels.moe_block.masking import local_expert_index, mask_affinities, mask_affinities_reference


def _routed(seed: int = 0, tokens: int = 5, experts: int = 8, k: int = 2):
    g = torch.Generator().manual_seed(seed)
    aff = torch.softmax(torch.randn(tokens, experts, generator=g), -1)
    idx = torch.sort(aff, dim=-1, descending=True, stable=True).indices[:, :k]
    return aff, idx


@pytest.mark.parametrize("rank, apply_mask", list(itertools.product((0, 1, 3), (False, True))))
def test_mask_matches_seed_loop_twin(rank: int, apply_mask: bool) -> None:
    aff, idx = _routed()
    got = mask_affinities(aff, idx, rank, 2, apply_mask)
    assert got.shape == (5, 2)
    torch.testing.assert_close(got, mask_affinities_reference(aff, idx, rank, 2, apply_mask), rtol=0, atol=0)


def test_index_mask_keeps_exactly_the_routed_local_experts() -> None:
    aff, idx = _routed()
    masked = mask_affinities(aff, idx, 1, 4, True)  # local experts 4..7
    for t in range(aff.shape[0]):
        for e in range(4):
            routed = bool((idx[t] == 4 + e).any())
            assert float(masked[t, e]) == (float(aff[t, 4 + e]) if routed else 0.0)


def test_local_index_maps_offsets_and_marks_other_ranks() -> None:
    idx = torch.tensor([[0, 5, -1], [7, 4, 3]])
    assert local_expert_index(idx, 1, 4).tolist() == [[-1, 1, -1], [3, 0, -1]]


@pytest.mark.parametrize("pre_norm, norm_topk, expected", [(True, False, True), (True, True, False),
                                                          (False, False, False), (False, True, False)])
def test_keystone_truth_table(pre_norm: bool, norm_topk: bool, expected: bool) -> None:
    cfg = MoeBlockConfig(top_k=2, num_experts=8, num_local_experts=8, router_pre_norm=pre_norm, norm_topk_prob=norm_topk)
    assert cfg.needs_index_mask is expected


def test_slice_beyond_experts_is_rejected() -> None:
    aff, idx = _routed()
    with pytest.raises(ValueError, match="exceeds E"):
        mask_affinities(aff, idx, 2, 4, False)
