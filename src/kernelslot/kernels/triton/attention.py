"""Triton ``attention.decode``: paged block-sparse decode attention over validator-selected blocks.

Layouts (docs/slots/attention.md): ``q (B, Hq, D)``; paged ``k_cache``, ``v_cache``
``(max_slots, Hkv, D)``; token ``t`` of request ``b`` lives in slot
``req_to_token[req_pool_indices[b], t]``; ``topk_idx (Hkv, B, Kb)`` logical block ids, block ``j``
covering positions ``[j·block_size, (j+1)·block_size)``; ``out (B, Hq, D)``. Every tensor is indexed
through its own strides. Query head ``h`` reads kv head ``h // (Hq // Hkv)``.

One program per (request, kv head) holds the kv head's whole query group (padded to 16 rows for
``tl.dot``) and walks its ``Kb`` ids: an id of -1, a repeat of an earlier id in the row, and
positions at or past ``seq_lens[b]`` (or the page table's width) are masked, never filtered on the
host. Each block is read in ``BLOCK_T``-token chunks: ``q·Kᵀ·sm_scale`` (``tl.dot``), an online
softmax in fp32 (running max and sum; a chunk with nothing visible changes nothing), ``P·V``
accumulated in fp32; a (request, head) with no visible token gets 0. Stored rounded to ``out.dtype``
to nearest even. No host synchronisation and no value-dependent shapes: graph-safe.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelslot.kernels.triton._common import dot_precision, pow2, to_output

__all__ = ["decode"]

BLOCK_T_MAX = 64  # tokens per chunk at most


@triton.jit
def _decode_kernel(q_ptr, q_s0, q_s1, q_s2, k_ptr, k_s0, k_s1, k_s2, v_ptr, v_s0, v_s1, v_s2,
                   table_ptr, t_s0, t_s1, seq_ptr, seq_s, pool_ptr, pool_s, ids_ptr, i_s0, i_s1, i_s2,
                   out_ptr, o_s0, o_s1, o_s2, sm_scale, block_size, width, group, head_dim, top_blocks,
                   BG: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, BG)  # query heads g·group + rows
    dims = tl.arange(0, BD)
    row_ok = rows < group
    dim_ok = dims < head_dim
    heads = g * group + rows
    q = tl.load(q_ptr + b * q_s0 + heads[:, None] * q_s1 + dims[None, :] * q_s2,
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    seq_len = tl.load(seq_ptr + b * seq_s)
    end = tl.minimum(seq_len, width)
    page_row = table_ptr + tl.load(pool_ptr + b * pool_s) * t_s0
    id_row = ids_ptr + g * i_s0 + b * i_s1
    slots_kb = tl.arange(0, 32)
    m_run = tl.full((BG,), float("-inf"), tl.float32)
    l_run = tl.zeros((BG,), tl.float32)
    acc = tl.zeros((BG, BD), tl.float32)
    for i in range(0, top_blocks):
        blk = tl.load(id_row + i * i_s2)
        repeat = 0
        for j0 in range(0, i, 32):  # an earlier equal id in the row: this one counts once, already
            earlier = j0 + slots_kb
            prev = tl.load(id_row + earlier * i_s2, mask=earlier < i, other=-1)
            repeat += tl.sum(((prev == blk) & (earlier < i)).to(tl.int32), axis=0)
        if (blk >= 0) & (repeat == 0):
            first = blk.to(tl.int64) * block_size
            for t0 in range(0, block_size, BT):
                offs = t0 + tl.arange(0, BT)
                pos = first + offs
                live = (offs < block_size) & (pos < end)
                slot = tl.load(page_row + pos * t_s1, mask=live, other=0).to(tl.int64)
                kv_mask = live[:, None] & dim_ok[None, :]
                k = tl.load(k_ptr + slot[:, None] * k_s0 + g * k_s1 + dims[None, :] * k_s2, mask=kv_mask, other=0.0)
                v = tl.load(v_ptr + slot[:, None] * v_s0 + g * v_s1 + dims[None, :] * v_s2, mask=kv_mask, other=0.0)
                logits = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=PREC) * sm_scale
                logits = tl.where(live[None, :], logits, float("-inf"))
                m_new = tl.maximum(m_run, tl.max(logits, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet: exp(-inf) = 0 below
                p = tl.exp(logits - m_safe[:, None])
                rescale = tl.exp(m_run - m_safe)
                l_run = l_run * rescale + tl.sum(p, axis=1)
                acc = acc * rescale[:, None] + tl.dot(p, v.to(tl.float32), input_precision=PREC)
                m_run = m_new
    result = acc / tl.maximum(l_run, 1.1754943508222875e-38)[:, None]  # empty set: acc = 0, l = 0 -> 0
    tl.store(out_ptr + b * o_s0 + heads[:, None] * o_s1 + dims[None, :] * o_s2,
             to_output(result, out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
           seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, topk_idx: torch.Tensor, out: torch.Tensor,
           sm_scale: float, block_size: int) -> None:
    """Block-sparse paged decode attention (module docstring) written into ``out``; returns None."""
    bsz, hq, d = q.shape
    hkv, _, top_blocks = topk_idx.shape
    if hq % hkv or k_cache.shape[1] != hkv or tuple(out.shape) != (bsz, hq, d) or topk_idx.shape[1] != bsz:
        raise ValueError(f"decode: q (B, Hq, D), caches (slots, Hkv, D), topk_idx (Hkv, B, Kb) and out like q "
                         f"expected, got {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(topk_idx.shape)} and {tuple(out.shape)}")
    if out.numel() == 0:
        return
    group = hq // hkv
    _decode_kernel[(bsz, hkv)](
        q, *q.stride(), k_cache, *k_cache.stride(), v_cache, *v_cache.stride(), req_to_token, *req_to_token.stride(),
        seq_lens, seq_lens.stride(0), req_pool_indices, req_pool_indices.stride(0), topk_idx, *topk_idx.stride(),
        out, *out.stride(), float(sm_scale), int(block_size), req_to_token.shape[1], group, d, top_blocks,
        BG=pow2(group, 16), BD=pow2(d, 16), BT=min(pow2(block_size, 16), BLOCK_T_MAX), PREC=dot_precision(q.dtype))
