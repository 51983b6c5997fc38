"""Broken moe.block_tkg: the honest example kernel, except each token's lowest-ranked routed expert is dropped."""

# A plain-torch moe.block_tkg kernel: residual add, RMSNorm, router, top-K, the routed experts of
# this rank (selective: only the experts some token chose) and the optional shared expert.
# What to change: keep the signatures; replace prepare() with your weight packing and
# block_tkg() with your kernel. Every fact of the layer is in `layer` (kernelslot slots
# moe.block_tkg lists its fields); the weights are dequantised once in prepare with the public
# codecs of kernelslot.formats.
import torch
import torch.nn.functional as F

from kernelslot.formats import dequantize_mx, dequantize_nvfp4, quantize_mx

_MX = {"mxfp4": "fp4", "mxfp8": "fp8_e4m3"}


def _dense(w):
    """ExpertWeights in any format -> fp32 gate_up (E, 2I, H) and down (E, H, I)."""
    def one(data, scale, outer):
        if w.format == "dense":
            return data.float()
        if w.format == "fp8_row":
            return data.float() * scale.reshape(data.shape[0], -1, 1).float()
        if w.format in _MX:
            return dequantize_mx(data, scale, _MX[w.format], torch.float32)
        return torch.stack([dequantize_nvfp4(data[e], scale[e], outer[e], torch.float32) for e in range(data.shape[0])])
    return one(w.gate_up, w.gate_up_scale, w.gate_up_outer), one(w.down, w.down_scale, w.down_outer)


def prepare(kind, layer):
    if kind != "moe_block":
        raise ValueError(f"unsupported prepare form {kind!r}")
    gate_up, down = _dense(layer.experts)
    shared = None
    if layer.shared is not None:
        sg, sd = _dense(layer.shared.weights)
        shared = (sg[0], sd[0], layer.shared.activation, layer.shared.gate)
    biases = (layer.experts.gate_up_bias, layer.experts.down_bias)
    return {"layer": layer, "gate_up": gate_up, "down": down, "biases": biases, "shared": shared,
            "mx": layer.experts.format in _MX}


def _glu(gu, act):
    inter = gu.shape[-1] // 2
    g, u = gu[..., :inter], gu[..., inter:]
    if act.gate_clamp != (None, None):
        g = g.clamp(min=act.gate_clamp[0], max=act.gate_clamp[1])
    if act.up_clamp != (None, None):
        u = u.clamp(min=act.up_clamp[0], max=act.up_clamp[1])
    if act.kind in ("silu", "swish", "swigluoai"):
        a = g * torch.sigmoid((1.0 if act.kind == "silu" else act.alpha) * g)
    else:
        a = F.gelu(g, approximate="tanh" if act.kind == "gelu_tanh" else "none")
    return a * (u + act.up_bias)


def _mxfp8(x):  # MX experts see their input and intermediate rounded to MXFP8 E4M3
    data, scales = quantize_mx(x, "fp8_e4m3")
    return dequantize_mx(data, scales, "fp8_e4m3", torch.float32)


def block_tkg(x, residual, prepared, eps, out, out_residual, router_logits):
    layer, cfg = prepared["layer"], prepared["layer"].config
    s = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    if out_residual is not None:
        out_residual.copy_(s)
    sf = s.float()
    h = sf * torch.rsqrt(sf.square().mean(-1, keepdim=True) + eps) * layer.gamma.float()
    logits = h @ layer.router_weight.float().T
    if layer.router_bias is not None:
        logits = logits + layer.router_bias.float()
    if router_logits is not None:
        router_logits.copy_(logits)
    act = torch.sigmoid if cfg.router_activation == "sigmoid" else (lambda v: torch.softmax(v, dim=-1))
    scores = act(logits) if cfg.router_pre_norm else logits
    select = scores if layer.correction_bias is None else scores + layer.correction_bias.float()
    chosen_ids = torch.argsort(-select, dim=-1, stable=True)[:, :cfg.top_k]  # lower index wins a tie
    coef = scores.gather(1, chosen_ids)
    if not cfg.router_pre_norm:
        coef = act(coef)
    if cfg.norm_topk_prob:
        coef = coef / coef.sum(-1, keepdim=True)
    if cfg.scaling.name == "NO_SCALE":
        coef = torch.ones_like(coef)
    if cfg.top_k > 1:  # THE BUG: each token's lowest-ranked routed expert contributes nothing
        coef = coef.clone()
        coef[:, -1] = 0
    lo = cfg.rank_id * cfg.num_local_experts
    acc = torch.zeros(out.shape, dtype=torch.float32)
    gu_bias, d_bias = prepared["biases"]
    hin = _mxfp8(h) if prepared["mx"] else h
    for e in (chosen_ids - lo).unique().tolist():
        if not 0 <= e < cfg.num_local_experts:
            continue  # an expert on another rank
        rows, slot = (chosen_ids - lo == e).nonzero(as_tuple=True)
        gu = hin[rows] @ prepared["gate_up"][e].T
        if gu_bias is not None:
            gu = gu + gu_bias[e].float()
        a = _glu(gu, cfg.activation)
        y = (_mxfp8(a) if prepared["mx"] else a) @ prepared["down"][e].T
        if d_bias is not None:
            y = y + d_bias[e].float()
        acc.index_add_(0, rows, y * coef[rows, slot].unsqueeze(1))
    acc = cfg.routed_scaling_factor * acc
    if prepared["shared"] is not None:
        sg, sd, sact, gate = prepared["shared"]
        sh = _glu(h @ sg.T, sact) @ sd.T
        if gate is not None:
            sh = sh * torch.sigmoid(h @ gate.float()).unsqueeze(1)
        acc = acc + sh
    out.copy_(acc)
