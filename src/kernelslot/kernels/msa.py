"""Built-in MSA (MiniMax sparse attention) index kernels: block scores and prefill block selection.

``msa_block_score(q, index_k, seq_lens, block_size, out)``: q ``(B, Hi, D)``, index_k ``(B, S, D)``
(one shared index-key head), out float32 ``(B, Hi, ceil(S / block_size))`` holding, per key block,
the max of ``q·k`` over the block's tokens ``t < seq_lens[b]`` and ``-inf`` where there are none.

``msa_prefill_block_score(...)`` (the ragged V2 call, docs/slots/attention.md): one call for the whole batch, no
per-request loop. Each query row is placed in a padded ``(B, max_seqlen_q)`` grid, scored against
its request's keys gathered through ``req_to_token[slot_ids[b]]`` (causal: key ``n`` visible to row
``m`` iff ``n <= prefix_lens[b] + m``), max-pooled over the rows of its query block and over the keys
of each key block. Forced blocks (the first ``init_blocks`` and the ``local_blocks`` ending at the
query block's last visible key block) score ``+inf``; a stable descending sort then picks forced
blocks first and breaks score ties towards the lower block index. Unused cells get -1.
All math in fp32; ``out``/``out_topk`` are written in place whatever their strides.
"""
from __future__ import annotations

import torch

__all__ = ["msa_block_score", "msa_prefill_block_score"]


def msa_block_score(q: torch.Tensor, index_k: torch.Tensor, seq_lens: torch.Tensor, block_size: int, out: torch.Tensor) -> None:
    """Per-request, per-head block-max index scores (``-inf`` for blocks with no live token)."""
    bsz, hi, _ = q.shape
    s = index_k.shape[1]
    n_blocks = out.shape[2]
    scores = torch.einsum("bhd,bsd->bhs", q.float(), index_k.float())
    live = torch.arange(s, device=q.device).view(1, 1, s) < seq_lens.view(bsz, 1, 1).long()
    scores = scores.masked_fill(~live, float("-inf"))
    pad = n_blocks * block_size - s
    if pad:
        scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
    out.copy_(scores.view(bsz, hi, n_blocks, block_size).amax(-1))


def msa_prefill_block_score(
    q: torch.Tensor,
    index_k_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    slot_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    prefix_lens: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    block_size_q: int,
    block_size_k: int,
    topk: int,
    init_blocks: int,
    local_blocks: int,
    scale: float,
    cu_seqblocks_q: torch.Tensor,
    max_seqblock_q: int,
    all_seqblock_q: int,
    out_topk: torch.Tensor,
) -> None:
    """Causal block-max index scores and top-k key-block selection for a ragged prefill batch."""
    total_q, hi, _ = q.shape
    bsz = slot_ids.shape[0]
    dev = q.device
    rows = torch.arange(total_q, device=dev)
    req = torch.searchsorted(cu_seqlens[1:].long(), rows, right=True)  # request of each query row
    local_row = rows - cu_seqlens.long()[req]
    last_key = prefix_lens.long()[req] + local_row  # the last key this row sees
    out_row = cu_seqblocks_q.long()[req] + local_row // block_size_q  # its query block's output row

    q_grid = q.new_zeros((bsz, max(max_seqlen_q, 1), hi, q.shape[2]), dtype=torch.float32)
    q_grid[req, local_row] = q.float()
    key_slots = req_to_token[slot_ids.long(), :max_seqlen_k].long()  # (B, max_seqlen_k)
    keys = index_k_cache[key_slots, 0].float()  # (B, max_seqlen_k, D)
    grid_scores = torch.einsum("bmhd,bnd->bmhn", q_grid, keys) * scale
    scores = grid_scores[req, local_row]  # (total_q, Hi, max_seqlen_k)
    future = torch.arange(max_seqlen_k, device=dev).view(1, 1, -1) > last_key.view(-1, 1, 1)
    scores = scores.masked_fill(future, float("-inf"))

    n_blocks = -(-max_seqlen_k // block_size_k)
    per_qblock = torch.full((all_seqblock_q, hi, max_seqlen_k), float("-inf"), device=dev)
    per_qblock.scatter_reduce_(0, out_row.view(-1, 1, 1).expand_as(scores), scores, "amax", include_self=True)
    pad = n_blocks * block_size_k - max_seqlen_k
    if pad:
        per_qblock = torch.nn.functional.pad(per_qblock, (0, pad), value=float("-inf"))
    block_scores = per_qblock.view(all_seqblock_q, hi, n_blocks, block_size_k).amax(-1)

    last_visible = torch.full((all_seqblock_q,), -1, dtype=torch.long, device=dev)
    last_visible.scatter_reduce_(0, out_row, last_key, "amax", include_self=True)
    last_block = (last_visible // block_size_k).view(-1, 1, 1)
    kb = torch.arange(n_blocks, device=dev).view(1, 1, -1)
    visible = kb <= last_block
    forced = visible & ((kb < init_blocks) | (kb > last_block - local_blocks))
    ranked = torch.where(forced, float("inf"), torch.where(visible, block_scores, float("-inf")))
    order_scores, order = torch.sort(ranked, dim=-1, descending=True, stable=True)
    keep = min(topk, n_blocks)
    chosen = torch.where(order_scores[..., :keep] == float("-inf"), -1, order[..., :keep])  # (R, Hi, keep)
    out_topk[:, :, :keep] = chosen.permute(1, 0, 2)
    out_topk[:, :, keep:] = -1
