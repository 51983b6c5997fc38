"""Router stage vs its twin, the routing modes, the correction bias and tie-breaking."""
from __future__ import annotations

import itertools

import pytest
import torch

from kernelslot.kernels.moe_block.router import route, route_reference


def _inputs(seed: int = 0, tokens: int = 6, hidden: int = 32, experts: int = 8):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g)
    w = torch.randn(experts, hidden, generator=g) / hidden**0.5
    bias = torch.randn(experts, generator=g) * 0.1
    corr = torch.randn(experts, generator=g) * 0.5
    return h, w, bias, corr


MODES = list(itertools.product(("softmax", "sigmoid"), (True, False), (True, False), (False, True), (False, True)))


@pytest.mark.parametrize("act, pre_norm, norm_topk, with_bias, with_corr", MODES)
def test_route_matches_twin(act: str, pre_norm: bool, norm_topk: bool, with_bias: bool, with_corr: bool) -> None:
    h, w, bias, corr = _inputs()
    args = (h, w, 3, act, pre_norm, norm_topk, bias if with_bias else None, corr if with_corr else None)
    got, ref = route(*args), route_reference(*args)
    assert torch.equal(got.expert_index, ref.expert_index)
    torch.testing.assert_close(got.logits, ref.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.affinities, ref.affinities, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.topk_affinities, ref.topk_affinities, atol=1e-6, rtol=1e-5)


def test_pre_norm_without_renorm_leaves_dense_affinities() -> None:
    h, w, _, _ = _inputs()
    r = route(h, w, 2, "softmax", True, False)
    assert bool((r.affinities > 0).all())  # dense: this is why the all-expert leaf must re-mask
    torch.testing.assert_close(r.affinities.sum(-1), torch.ones(h.shape[0]))


@pytest.mark.parametrize("pre_norm, norm_topk", [(True, True), (False, False), (False, True)])
def test_other_modes_scatter_only_the_top_k(pre_norm: bool, norm_topk: bool) -> None:
    h, w, _, _ = _inputs()
    r = route(h, w, 3, "softmax", pre_norm, norm_topk)
    assert int((r.affinities != 0).sum(-1).max()) == 3
    if norm_topk or not pre_norm:  # post-norm softmax runs over the K only
        torch.testing.assert_close(r.topk_affinities.sum(-1), torch.ones(h.shape[0]))


def test_correction_bias_changes_selection_not_weights() -> None:
    h, w, _, _ = _inputs()
    corr = torch.zeros(8)
    corr[5] = 100.0  # expert 5 is always selected
    r = route(h, w, 2, "sigmoid", True, True, correction_bias=corr)
    assert bool((r.expert_index == 5).any(-1).all())
    plain = torch.sigmoid(h @ w.t())
    chosen = plain.gather(1, r.expert_index)
    torch.testing.assert_close(r.topk_affinities, chosen / chosen.sum(-1, keepdim=True))


def test_ties_go_to_the_lower_expert_index() -> None:
    h = torch.ones(2, 4)
    w = torch.zeros(6, 4)  # all logits equal
    for pre_norm in (True, False):
        r = route(h, w, 3, "softmax", pre_norm, False)
        assert r.expert_index.tolist() == [[0, 1, 2], [0, 1, 2]]
        assert torch.equal(r.expert_index, route_reference(h, w, 3, "softmax", pre_norm, False).expert_index)
    w[4] = 1.0  # one clear winner, the rest tied
    assert route(h, w, 2, "sigmoid", True, False).expert_index.tolist() == [[4, 0], [4, 0]]
