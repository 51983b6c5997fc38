"""Stage 2: router top-K on the normed hidden (seed ``_router_topk``), with its torch twin.

Contract: ``h`` fp32 ``(T, H)``; ``weight`` ``(E, H)``; optional ``bias`` ``(E,)`` added to the
logits; optional ``correction_bias`` ``(E,)`` added to the *selection* scores only (MiniMax-M3's
``e_score_correction_bias``), never to the affinities.

- ``logits = h·Wᵀ (+ bias)`` in fp32.
- pre-norm: ``scores = act(logits)`` over all E; selection on ``scores (+ correction)``; the
  affinities are the scores (dense ``[T, E]``), or, with ``norm_topk_prob``, the K chosen
  scores divided by their sum, scattered (zero elsewhere).
- post-norm: selection on ``logits (+ correction)``; ``act`` over the K chosen logits only
  (softmax over K, or sigmoid elementwise), optionally renormalised, scattered.
- Ties are broken deterministically: among equal scores the lower expert index wins.

Returns :class:`RouterOutput` with global expert ids ``(T, K)`` int64 ordered by descending
selection score.
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
