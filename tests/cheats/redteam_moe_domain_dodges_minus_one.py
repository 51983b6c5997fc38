"""Declares a domain (``num_tokens`` = 1) that contains no adversarial profile, then skips -1 handling.

The only ``moe.fused_experts`` profile with one token is ``decode_t1_k1_raw_weight`` (K = 1,
no -1 ids); every profile with -1 ids has more tokens, so it is reported as skipped ("the
incumbent runs") and the slot passes because one profile was exercised. Yet the domain admits
every one-token decode call, including expert-parallel ones whose ids hold -1: this kernel
indexes the weights with -1 (Python's "last expert") there. Catching it needs in-domain
coverage: instantiate the adversarial patterns (-1 ids, K > 1, raw weights) at a shape inside
the declared domain (e.g. re-shape ``ep_shard_minus_one`` to M = 1 with K = 4), or fail a domain
that excludes every profile tagged ``adversarial``.

Verify with ``Candidate(kernel, CapabilityDomain.from_mapping(DOMAIN))`` and ``model=MODEL``.
"""
import torch

SLOT = "moe.fused_experts"
MODEL = "generic"
DOMAIN = {"num_tokens": {"range": [1, 1]}}
CATCHES = {"compare"}


def prepare(w13, w2):
    return (w13.float().contiguous(), w2.float().contiguous())


def entry(x, topk_ids, topk_weights, prepared, out):
    w13, w2 = prepared
    inter = w2.shape[2]
    acc = torch.zeros(out.shape, dtype=torch.float32)
    for m in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[m, j])  # -1 is not skipped: w13[-1] is the last expert
            gu = w13[e] @ x[m].float()
            acc[m] += float(topk_weights[m, j]) * (w2[e] @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:]))
    out.copy_(acc.to(out.dtype))
