"""Honest fused experts: per routed expert, fp32 gate/up, activation, down, weighted sum."""
import torch


def prepare(w13, w2):
    return w13.float(), w2.float()


def _run(x, topk_ids, topk_weights, prepared, out, act):
    w13, w2 = prepared
    inter = w2.shape[2]
    acc = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32)
    xf = x.float()
    for e in torch.unique(topk_ids).tolist():
        if e < 0:
            continue
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        gu = xf[rows] @ w13[e].T
        y = act(gu[:, :inter], gu[:, inter:]) @ w2[e].T
        acc.index_add_(0, rows, y * topk_weights[rows, slots].float().unsqueeze(1))
    out.copy_(acc)


def _silu(g, u):
    return torch.nn.functional.silu(g) * u


def _swigluoai(g, u):
    g = g.clamp(max=7.0)
    u = u.clamp(-7.0, 7.0)
    return g * torch.sigmoid(1.702 * g) * (u + 1.0)


def silu_experts(x, topk_ids, topk_weights, prepared, out):
    _run(x, topk_ids, topk_weights, prepared, out, _silu)


def swigluoai_experts(x, topk_ids, topk_weights, prepared, out):
    _run(x, topk_ids, topk_weights, prepared, out, _swigluoai)
