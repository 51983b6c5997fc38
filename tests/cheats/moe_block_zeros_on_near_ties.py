"""Recomputes the public near-tie rule and writes zeros on those tokens' rows.

The referee used to mark a token whose K-th and (K+1)-th selection scores were closer than the
dtype's default tolerance as "don't care" (NaN in the reference), and any value passed there:
about 30% of bf16 tokens. With admissible sets each such row must equal the reference under one
of the routings an honest kernel may take, so zeros fail.
"""
import torch

from kernelslot.abi.comparators import default_tol
from kernelslot.kernels.moe_block import moe_block_tkg, prepare_moe_block

SLOT = "moe.block_tkg"
CATCHES = {"compare", "replay"}


def prepare(kind, layer):
    return prepare_moe_block(kind, layer), layer


def entry(x, residual, prepared, eps, out, out_residual, router_logits):
    inner, layer = prepared
    moe_block_tkg(x, residual, inner, eps, out, out_residual, router_logits)
    cfg = layer.config
    if cfg.top_k >= cfg.num_experts:
        return
    s = x.double() if residual is None else (x.double() + residual.double()).to(x.dtype).double()
    h = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * layer.gamma.double()).float().double()
    logits = h @ layer.router_weight.double().t()
    if layer.router_bias is not None:
        logits = logits + layer.router_bias.double()
    act = torch.sigmoid if cfg.router_activation == "sigmoid" else (lambda v: torch.softmax(v, dim=-1))
    scores = act(logits) if cfg.router_pre_norm else logits
    select = scores if layer.correction_bias is None else scores + layer.correction_bias.double()
    ranked = select.sort(dim=-1, descending=True).values
    gap = ranked[:, cfg.top_k - 1] - ranked[:, cfg.top_k]
    slope = 0.25 if cfg.router_pre_norm else 1.0
    near = gap <= default_tol(x.dtype) * slope * (logits.abs().amax(-1) + 1.0)  # the old don't-care rule
    out[near] = 0
