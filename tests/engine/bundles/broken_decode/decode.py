"""Broken decode attention: kernelslot's own kernel, but each request's highest selected block
(its most recent tokens) is dropped whenever more than one block is selected."""
import torch

from kernelslot.kernels.attention import decode as _decode


def decode(q, k_cache, v_cache, req_to_token, seq_lens, req_pool_indices, topk_idx, out, sm_scale, block_size):
    ids = topk_idx.clone()
    if ids.shape[2] > 1:
        last = ids.max(dim=2, keepdim=True).values
        ids = torch.where(ids == last, torch.full_like(ids, -1), ids)
    _decode(q, k_cache, v_cache, req_to_token, seq_lens, req_pool_indices, ids, out, sm_scale, block_size)
