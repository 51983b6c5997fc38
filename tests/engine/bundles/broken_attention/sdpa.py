"""Broken GQA attention: the causal mask is dropped."""
import torch.nn.functional as F


def sdpa(q, k, v, out, sm_scale, causal):
    group = q.shape[1] // k.shape[1]
    qh = q.float().transpose(0, 1)
    kh = k.float().transpose(0, 1).repeat_interleave(group, dim=0)
    vh = v.float().transpose(0, 1).repeat_interleave(group, dim=0)
    out.copy_(F.scaled_dot_product_attention(qh, kh, vh, scale=sm_scale).transpose(0, 1))
