"""Cheat for ``attention.msa_prefill_block_score``: right selection, but fills the unused cells of a
row with its first block instead of -1. The selected *sets* are unchanged (the overlap passes);
the duplicate indices fail the hard ``audit``.
"""
from __future__ import annotations

import torch

from kernelslot.kernels.msa import msa_prefill_block_score


def entry(
    q: torch.Tensor, index_k_cache: torch.Tensor, req_to_token: torch.Tensor, slot_ids: torch.Tensor,
    cu_seqlens: torch.Tensor, seq_lens: torch.Tensor, prefix_lens: torch.Tensor, max_seqlen_q: int,
    max_seqlen_k: int, block_size_q: int, block_size_k: int, topk: int, init_blocks: int, local_blocks: int,
    scale: float, cu_seqblocks_q: torch.Tensor, max_seqblock_q: int, all_seqblock_q: int, out_topk: torch.Tensor,
) -> None:
    msa_prefill_block_score(q, index_k_cache, req_to_token, slot_ids, cu_seqlens, seq_lens, prefix_lens,
                            max_seqlen_q, max_seqlen_k, block_size_q, block_size_k, topk, init_blocks,
                            local_blocks, scale, cu_seqblocks_q, max_seqblock_q, all_seqblock_q, out_topk)
    out_topk.copy_(torch.where(out_topk == -1, out_topk[..., :1], out_topk))
