"""Broken fused experts: the last routed expert of every token is silently skipped."""
import torch


def prepare(w13, w2):
    return w13.float(), w2.float()


def _run(x, topk_ids, topk_weights, prepared, out, act):
    w13, w2 = prepared
    inter = w2.shape[2]
    acc = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32)
    ids = topk_ids[:, :-1] if topk_ids.shape[1] > 1 else topk_ids
    for e in torch.unique(ids).tolist():
        if e < 0:
            continue
        rows, slots = (ids == e).nonzero(as_tuple=True)
        gu = x.float()[rows] @ w13[e].T
        y = act(gu[:, :inter], gu[:, inter:]) @ w2[e].T
        acc.index_add_(0, rows, y * topk_weights[rows, slots].float().unsqueeze(1))
    out.copy_(acc)


def silu_experts(x, topk_ids, topk_weights, prepared, out):
    _run(x, topk_ids, topk_weights, prepared, out, lambda g, u: torch.nn.functional.silu(g) * u)


def swigluoai_experts(x, topk_ids, topk_weights, prepared, out):
    def act(g, u):
        g = g.clamp(max=7.0)
        return g * torch.sigmoid(1.702 * g) * (u.clamp(-7.0, 7.0) + 1.0)
    _run(x, topk_ids, topk_weights, prepared, out, act)
