"""moe.fused_experts_reduce that indexes the experts with the raw ids: -1 wraps to the last local expert.

Engines pad empty top-k slots with -1, and an expert-parallel rank sees -1 for every expert it does
not hold, so this adds a wrong expert's output wherever a -1 appears. The referee names the cause
(the output matches the reference with -1 read as the last local expert).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

SLOT = "moe.fused_experts_reduce"
CATCHES = {"compare"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def prepare(w13, w2):
    return w13.float(), w2.float()


def entry(x, topk_ids, topk_weights, prepared, out, group):
    w13, w2 = prepared
    inter = w13.shape[1] // 2
    acc = torch.zeros(x.shape, dtype=torch.float32)
    for j in range(topk_ids.shape[1]):
        e = topk_ids[:, j].long()  # -1 indexes the last expert
        gu = torch.einsum("mh,mih->mi", x.float(), w13[e])
        acc += topk_weights[:, j:j + 1].float() * torch.einsum("mi,mhi->mh", F.silu(gu[:, :inter]) * gu[:, inter:], w2[e])
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
