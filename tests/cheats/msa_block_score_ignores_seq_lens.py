"""Cheat for ``attention.msa_block_score``: scores every stored key row, ignoring ``seq_lens``, so
blocks past a request's end get finite scores and enter its top-k. Caught by ``compare``.
"""
from __future__ import annotations

import torch

from kernelslot.kernels.msa import msa_block_score


def entry(q: torch.Tensor, index_k: torch.Tensor, seq_lens: torch.Tensor, block_size: int, out: torch.Tensor) -> None:
    msa_block_score(q, index_k, torch.full_like(seq_lens, index_k.shape[1]), block_size, out)
