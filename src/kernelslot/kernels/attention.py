"""Built-in attention kernels: ``attention.sdpa`` and ``attention.decode`` (write-into-output).

Layouts (docs/slots/attention.md): sdpa q ``(T, Hq, D)``, k/v ``(S, Hkv, D)``; decode q ``(B, Hq, D)``, paged
k/v caches ``(max_slots, Hkv, D)``, ``topk_idx (Hkv, B, Kb)`` int32 logical block ids (-1 = none).
Query head ``h`` reads kv head ``h // (Hq // Hkv)``. Math in fp32, softmax with the max subtracted,
cast once into ``out`` (any strides). Both entries return None.

The decode kernel is graph-safe by construction: no host synchronisation (no ``.item()``, no
``nonzero``, no Python branch on tensor values) and every intermediate has a shape fixed by the
argument shapes. Invalid, repeated and out-of-sequence block ids are masked, never filtered out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["sdpa", "decode"]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, sm_scale: float, causal: bool) -> None:
    """Scaled dot-product attention with GQA; ``causal`` is bottom-right aligned (``j <= i + S - T``)."""
    t, s = q.shape[0], k.shape[0]
    mask = None
    if causal:
        rows = torch.arange(t, device=q.device).unsqueeze(1)
        cols = torch.arange(s, device=q.device).unsqueeze(0)
        mask = cols <= rows + (s - t)
    res = F.scaled_dot_product_attention(
        q.transpose(0, 1).float(), k.transpose(0, 1).float(), v.transpose(0, 1).float(),
        attn_mask=mask, scale=sm_scale, enable_gqa=q.shape[1] != k.shape[1],
    )
    out.copy_(res.transpose(0, 1))


def _first_occurrence(ids: torch.Tensor) -> torch.Tensor:
    """Bool mask over the last dim: True where the id has not appeared earlier in its row."""
    kb = ids.shape[-1]
    same = ids.unsqueeze(-1) == ids.unsqueeze(-2)  # (..., Kb, Kb): [i, j] = ids[i] == ids[j]
    earlier = torch.ones(kb, kb, dtype=torch.bool, device=ids.device).tril(-1)  # j < i
    return ~(same & earlier).any(-1)


def decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    topk_idx: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float,
    block_size: int,
) -> None:
    """Block-sparse paged decode attention over the union of each (kv head, request)'s selected blocks."""
    b, hq, d = q.shape
    hkv, _, kb = topk_idx.shape
    group = hq // hkv
    width = req_to_token.shape[1]
    ids = topk_idx.long()  # (Hkv, B, Kb)
    block_ok = (ids >= 0) & _first_occurrence(ids)
    offsets = torch.arange(block_size, device=q.device)
    pos = ids.clamp(min=0).unsqueeze(-1) * block_size + offsets  # (Hkv, B, Kb, bs) token positions
    token_ok = block_ok.unsqueeze(-1) & (pos < seq_lens.view(1, b, 1, 1).long()) & (pos < width)
    pos = pos.clamp(max=width - 1).reshape(hkv, b, kb * block_size)
    token_ok = token_ok.reshape(hkv, b, kb * block_size)

    table = req_to_token[req_pool_indices.long()].long()  # (B, width)
    slots = table.unsqueeze(0).expand(hkv, b, width).gather(-1, pos)  # (Hkv, B, L)
    heads = torch.arange(hkv, device=q.device).view(hkv, 1, 1)
    keys = k_cache[slots, heads].float()  # (Hkv, B, L, D)
    values = v_cache[slots, heads].float()

    qg = q.float().view(b, hkv, group, d).permute(1, 0, 2, 3)  # (Hkv, B, group, D)
    logits = torch.einsum("gbrd,gbld->gbrl", qg, keys) * sm_scale
    mask = token_ok.unsqueeze(2)  # (Hkv, B, 1, L)
    logits = logits.masked_fill(~mask, float("-inf"))
    peak = logits.amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))  # rows with nothing to attend
    weights = torch.exp(logits - peak)  # exactly 0 where masked
    denom = weights.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    attended = torch.einsum("gbrl,gbld->gbrd", weights, values) / denom  # all-masked rows give 0
    out.copy_(attended.permute(1, 0, 2, 3).reshape(b, hq, d))
