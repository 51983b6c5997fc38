"""Honest GQA attention via torch's fused SDPA, with bottom-right causal alignment."""
import torch
import torch.nn.functional as F


def sdpa(q, k, v, out, sm_scale, causal):
    T, Hq, D = q.shape
    S, Hkv, _ = k.shape
    group = Hq // Hkv
    qh = q.float().transpose(0, 1)  # (Hq, T, D)
    kh = k.float().transpose(0, 1).repeat_interleave(group, dim=0)
    vh = v.float().transpose(0, 1).repeat_interleave(group, dim=0)
    mask = None
    if causal:
        i = torch.arange(T, device=q.device).unsqueeze(1)
        j = torch.arange(S, device=q.device).unsqueeze(0)
        mask = j <= i + (S - T)
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=sm_scale)
    out.copy_(o.transpose(0, 1))
