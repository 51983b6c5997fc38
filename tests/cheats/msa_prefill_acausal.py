"""Cheat for ``attention.msa_prefill_block_score``: ignores the causal visibility rule — every query
block scores all of its request's keys (``n < seq_len``) and may select key blocks that lie in its
future. The hard ``audit`` rejects the first such index.
"""
from __future__ import annotations

import torch


def entry(
    q: torch.Tensor, index_k_cache: torch.Tensor, req_to_token: torch.Tensor, slot_ids: torch.Tensor,
    cu_seqlens: torch.Tensor, seq_lens: torch.Tensor, prefix_lens: torch.Tensor, max_seqlen_q: int,
    max_seqlen_k: int, block_size_q: int, block_size_k: int, topk: int, init_blocks: int, local_blocks: int,
    scale: float, cu_seqblocks_q: torch.Tensor, max_seqblock_q: int, all_seqblock_q: int, out_topk: torch.Tensor,
) -> None:
    out_topk.fill_(-1)
    for b in range(slot_ids.shape[0]):
        start, end, seq_len = int(cu_seqlens[b]), int(cu_seqlens[b + 1]), int(seq_lens[b])
        keys = index_k_cache[req_to_token[int(slot_ids[b]), :seq_len].long(), 0].float()
        n_blocks = -(-seq_len // block_size_k)
        pad = n_blocks * block_size_k - seq_len
        for qb in range(-(-(end - start) // block_size_q)):
            rows = q[start + qb * block_size_q:min(start + (qb + 1) * block_size_q, end)].float()
            scores = (torch.einsum("mhd,nd->hmn", rows, keys) * scale).amax(1)  # no causal mask
            scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
            block_max = scores.view(scores.shape[0], n_blocks, block_size_k).amax(-1)
            block_max[:, :init_blocks] = float("inf")
            block_max[:, max(n_blocks - local_blocks, 0):] = float("inf")
            keep = min(topk, n_blocks)
            out_topk[:, int(cu_seqblocks_q[b]) + qb, :keep] = block_max.topk(keep, dim=-1).indices.to(out_topk.dtype)
