"""moe.block_tkg vs transformers' GPT-OSS MoE MLP (random init, no download).

GPT-OSS keeps ``gate_up_proj (E, H, 2I)`` with gate and up *interleaved* along the last dim
and ``down_proj (E, I, H)``; the view de-interleaves into gate rows then up rows. Routing:
top-K on biased logits, softmax over the K (``router_pre_norm=False``); swigluoai with biases.
"""
from __future__ import annotations


import pytest
import torch

from kernelslot.kernels.moe_block import MoeBlockConfig, moe_block_tkg
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.slots.moe_block import MoeBlockLayer
from tests.helpers import prepare_block

go = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
from transformers import GptOssConfig  # noqa: E402

H, I, E, K = 64, 32, 8, 4


@pytest.mark.parametrize("path", ["prepared", "torch"])
@pytest.mark.parametrize("strategy", ["selective", "all_expert"])
@pytest.mark.parametrize("tokens", [1, 5])
def test_block_matches_gpt_oss_norm_plus_mlp(strategy: str, tokens: int, path: str) -> None:
    torch.manual_seed(0)
    cfg = GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K,
                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=32)
    mlp, norm = go.GptOssMLP(cfg).eval(), go.GptOssRMSNorm(H, eps=cfg.rms_norm_eps).eval()
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_(0.0, 0.3)
        norm.weight.normal_(1.0, 0.1)
    ex = mlp.experts
    gate_up = torch.cat([ex.gate_up_proj.data[:, :, ::2], ex.gate_up_proj.data[:, :, 1::2]], dim=2).transpose(1, 2)
    gate_up_bias = torch.cat([ex.gate_up_proj_bias.data[:, ::2], ex.gate_up_proj_bias.data[:, 1::2]], dim=1)
    experts = ExpertWeights("dense", gate_up.contiguous(), ex.down_proj.data.transpose(1, 2).contiguous(),
                            gate_up_bias=gate_up_bias, down_bias=ex.down_proj_bias.data)
    config = MoeBlockConfig(top_k=K, num_experts=E, num_local_experts=E, router_activation="softmax",
                            router_pre_norm=False, norm_topk_prob=False,
                            activation=ExpertActivation.swigluoai(cfg.swiglu_alpha, cfg.swiglu_limit), strategy=strategy)
    layer = MoeBlockLayer(norm.weight.data, mlp.router.weight.data, experts, config, router_bias=mlp.router.bias.data)
    g = torch.Generator().manual_seed(1)
    x, residual = torch.randn(tokens, H, generator=g), torch.randn(tokens, H, generator=g)
    with torch.no_grad():
        want, _ = mlp(norm(x + residual).unsqueeze(0))
    out, out_res = torch.empty(tokens, H), torch.empty(tokens, H)
    moe_block_tkg(x, residual, prepare_block(layer, path), cfg.rms_norm_eps, out, out_res)
    torch.testing.assert_close(out_res, x + residual)
    torch.testing.assert_close(out, want.squeeze(0), atol=1e-5, rtol=1e-5)
    assert want.abs().max() > 0.1
