"""Paged block-sparse decode attention in plain torch (fp32 math, one cast)."""
import torch


def _tokens(ids, bs, seq_len):
    blocks = sorted({int(j) for j in ids if int(j) >= 0})
    toks = [t for j in blocks for t in range(j * bs, (j + 1) * bs) if t < seq_len]
    return torch.tensor(toks, dtype=torch.long)


def _attend(q, k_cache, v_cache, req_to_token, seq_lens, req_pool_indices, topk_idx, out, sm_scale, block_size,
            drop_last_block):
    b_count, hq, _ = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    for b in range(b_count):
        row = req_to_token[int(req_pool_indices[b])]
        for g in range(hkv):
            ids = topk_idx[g, b].tolist()
            if drop_last_block:
                ids = [j for j in ids if j != max(ids)] if len(set(j for j in ids if j >= 0)) > 1 else ids
            toks = _tokens(ids, block_size, int(seq_lens[b]))
            heads = slice(g * group, (g + 1) * group)
            if toks.numel() == 0:
                out[b, heads] = 0
                continue
            slots = row[toks].long()
            k, v = k_cache[slots, g].float(), v_cache[slots, g].float()  # (n, D)
            p = torch.softmax(sm_scale * q[b, heads].float() @ k.T, dim=-1)
            out[b, heads] = (p @ v).to(out.dtype)


def decode(q, k_cache, v_cache, req_to_token, seq_lens, req_pool_indices, topk_idx, out, sm_scale, block_size):
    _attend(q, k_cache, v_cache, req_to_token, seq_lens, req_pool_indices, topk_idx, out, sm_scale, block_size, False)
