"""A two-stage top-k that assumes the maxima are spread out: it keeps each tile's best few.

The selection runs per tile of ``TILE`` key blocks, keeping the ``KEEP`` best (forced blocks
included) of each, then merges the survivors with one sort. That is exact whenever no tile holds
more than ``KEEP`` of a row's selected blocks, which random scores almost never produce; it loses
the selection's tail when the best blocks cluster in one tile (``clustered_maxima_*`` profiles).
"""
import torch

from kernelslot.kernels.msa import msa_prefill_block_score

SLOT = "attention.msa_prefill_block_score"
CATCHES = {"compare", "replay"}
TILE, KEEP = 8, 7


def entry(q, index_k_cache, req_to_token, slot_ids, cu_seqlens, seq_lens, prefix_lens, max_seqlen_q, max_seqlen_k,
          block_size_q, block_size_k, topk, init_blocks, local_blocks, scale, cu_seqblocks_q, max_seqblock_q,
          all_seqblock_q, out_topk):
    # the exact selection with topk = every block ranks each row's blocks; keep those the tiles let through
    n_blocks = -(-max_seqlen_k // block_size_k)
    full = torch.full((out_topk.shape[0], out_topk.shape[1], n_blocks), -1, dtype=torch.int32)
    msa_prefill_block_score(q, index_k_cache, req_to_token, slot_ids, cu_seqlens, seq_lens, prefix_lens, max_seqlen_q,
                            max_seqlen_k, block_size_q, block_size_k, n_blocks, init_blocks, local_blocks, scale,
                            cu_seqblocks_q, max_seqblock_q, all_seqblock_q, full)
    ranked = full.long()  # each row's blocks best first, then -1
    tile = torch.nn.functional.one_hot(ranked.clamp(min=0) // TILE, -(-n_blocks // TILE))  # (Hi, R, n, tiles)
    nth_of_tile = (tile.cumsum(-2) * tile).sum(-1)  # 1 for a tile's best block, 2 for its second, ...
    kept = (ranked >= 0) & (nth_of_tile <= KEEP)
    order = torch.sort((~kept).to(torch.int8), dim=-1, stable=True).indices  # survivors first, in rank order
    survivors = torch.where(kept.gather(-1, order), ranked.gather(-1, order), -1)
    out_topk.copy_(survivors[..., :topk] if n_blocks >= topk else
                   torch.nn.functional.pad(survivors, (0, topk - n_blocks), value=-1))
