"""Cheat for ``attention.decode``: clamps the block ids for the gather and forgets to mask the -1
cells, so every -1 attends block 0. Caught by ``compare`` wherever a row holds -1 and not block 0
(above all a request whose ids are all -1, whose output must be 0).
"""
from __future__ import annotations

import torch

from kernelslot.kernels.attention import decode


def entry(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
    seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, topk_idx: torch.Tensor, out: torch.Tensor,
    sm_scale: float, block_size: int,
) -> None:
    decode(q, k_cache, v_cache, req_to_token, seq_lens, req_pool_indices, topk_idx.clamp(min=0), out,
           sm_scale, block_size)
