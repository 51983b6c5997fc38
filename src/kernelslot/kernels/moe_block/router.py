"""Stage 2: router top-K on the normed hidden (seed 003 ``_router_topk``), with its torch twin.

Seed 003 is the MoE decode megakernel source document the project was created from
(``../shared/seeds/003_fbad06efb3d9daf3.txt``, a walkthrough of nkilib's ``moe_block_tkg``).
The router reads stage 1's ``h`` and produces the logits (an optional block output), each
token's K global expert ids and the affinities that :mod:`masking` and the leaves consume.
It runs in fp32 on the fp32 ``h`` (the seed casts the router input to bf16).

Dimensions:
    T tokens, H hidden, E global experts, K top-k.

Arguments:
    h                (T, H) fp32, the normed hidden.
    weight           (E, H), any float dtype (used as fp32).
    top_k            K.   activation: ``sigmoid`` | ``softmax``.
    pre_norm         router_pre_norm: activation over all E before top-K (True), or top-K on the
                     raw logits and activation over the K chosen only (False).
    norm_topk_prob   divide the K chosen affinities by their sum.
    bias             (E,) or None, added to the logits.
    correction_bias  (E,) or None, added to the *selection* scores only (MiniMax-M3's
                     ``e_score_correction_bias``), never to the affinities.

Returns:
    :class:`RouterOutput`: ``logits`` (T, E) fp32 (with ``bias``, no correction bias);
    ``expert_index`` (T, K) int64 global ids ordered by descending selection score;
    ``affinities`` (T, E) fp32, dense (pre-norm without renorm) or the K chosen scattered into
    zeros; ``topk_affinities`` (T, K) fp32, the chosen affinities aligned with ``expert_index``.

Pseudocode::

    logits = h·Wᵀ (+ bias)                                         # fp32
    scores = act(logits) over all E   if pre_norm else logits
    ids    = top_K(scores (+ correction_bias))     # stable sort: among equal scores the lower index wins
    chosen = scores[ids];  if not pre_norm: chosen = act(chosen)   # softmax over K, or sigmoid
    if norm_topk_prob: chosen = chosen / Σ_K chosen
    affinities = scores if (pre_norm and not norm_topk_prob) else scatter(zeros(T, E), ids, chosen)

The twin ranks experts by explicit counting in fp64 (rank = #strictly higher scores +
#lower-index equal scores; chosen = rank < K, ordered by rank).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class RouterOutput:
    logits: torch.Tensor  # (T, E) fp32, h·Wᵀ + bias (no correction bias)
    expert_index: torch.Tensor  # (T, K) int64 global ids, best first
    affinities: torch.Tensor  # (T, E) fp32: dense (pre-norm, no renorm) or scattered top-K
    topk_affinities: torch.Tensor  # (T, K) fp32, affinities gathered at expert_index


def _activate(values: torch.Tensor, act: str) -> torch.Tensor:
    if act == "sigmoid":
        return torch.sigmoid(values)
    if act == "softmax":
        return torch.softmax(values, dim=-1)
    raise ValueError(f"router activation {act!r}; allowed: sigmoid, softmax")


def route(
    h: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    activation: str,
    pre_norm: bool,
    norm_topk_prob: bool,
    bias: Optional[torch.Tensor] = None,
    correction_bias: Optional[torch.Tensor] = None,
) -> RouterOutput:
    """Router GEMM + activation + top-K + scatter. See the module docstring."""
    logits = h @ weight.float().t()
    if bias is not None:
        logits = logits + bias.float()
    scores = _activate(logits, activation) if pre_norm else logits
    select = scores + correction_bias.float() if correction_bias is not None else scores
    # A stable descending sort keeps equal scores in ascending expert order: lower index wins.
    expert_index = torch.sort(select, dim=-1, descending=True, stable=True).indices[:, :top_k]
    chosen = scores.gather(1, expert_index)
    if not pre_norm:
        chosen = _activate(chosen, activation)
    if norm_topk_prob:
        chosen = chosen / chosen.sum(dim=-1, keepdim=True)
    if pre_norm and not norm_topk_prob:
        affinities = scores
    else:
        affinities = torch.zeros_like(logits).scatter_(1, expert_index, chosen)
    return RouterOutput(logits, expert_index, affinities, chosen)


def route_reference(
    h: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    activation: str,
    pre_norm: bool,
    norm_topk_prob: bool,
    bias: Optional[torch.Tensor] = None,
    correction_bias: Optional[torch.Tensor] = None,
) -> RouterOutput:
    """Torch twin of :func:`route`: top-K by explicit rank counting instead of a sort.

    Expert e's rank = #experts with a strictly higher score + #lower-index experts with an
    equal score; the chosen set is rank < K, ordered by rank.
    """
    logits = torch.einsum("th,eh->te", h.double(), weight.double())
    if bias is not None:
        logits = logits + bias.double()
    if pre_norm:
        scores = torch.sigmoid(logits) if activation == "sigmoid" else torch.softmax(logits, dim=-1)
    else:
        scores = logits
    select = scores + (correction_bias.double() if correction_bias is not None else 0.0)
    num_experts = select.shape[-1]
    a = select.unsqueeze(-1)  # (T, E, 1) expert e
    b = select.unsqueeze(-2)  # (T, 1, E) competitor j
    lower = torch.arange(num_experts).unsqueeze(0) < torch.arange(num_experts).unsqueeze(1)  # [e, j]: j < e
    rank = ((b > a) | ((b == a) & lower)).sum(-1)  # (T, E)
    expert_index = torch.argsort(rank, dim=-1)[:, :top_k]
    chosen = scores.gather(1, expert_index)
    if not pre_norm:
        chosen = torch.sigmoid(chosen) if activation == "sigmoid" else torch.softmax(chosen, dim=-1)
    if norm_topk_prob:
        chosen = chosen / chosen.sum(dim=-1, keepdim=True)
    if pre_norm and not norm_topk_prob:
        affinities = scores.clone()
    else:
        affinities = torch.zeros_like(scores)
        affinities.scatter_(1, expert_index, chosen)
    return RouterOutput(logits.float(), expert_index, affinities.float(), chosen.float())
