"""moe.block_tkg vs transformers' Qwen3-MoE sparse MoE block (random init, no download).

Both ``norm_topk_prob`` settings: with ``False`` the router leaves dense softmax affinities,
so the all-expert strategy depends on the keystone index mask to match the engine.
"""
from __future__ import annotations


import pytest
import torch

from kernelslot.kernels.moe_block import MoeBlockConfig, moe_block_tkg
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.slots.moe_block import MoeBlockLayer
from tests.helpers import prepare_block

qm = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
from transformers import Qwen3MoeConfig  # noqa: E402

H, I, E, K = 64, 32, 8, 2


@pytest.mark.parametrize("path", ["prepared", "torch"])
@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("strategy", ["selective", "all_expert"])
@pytest.mark.parametrize("tokens", [1, 6])
def test_block_matches_qwen3_moe_norm_plus_sparse_block(norm_topk_prob: bool, strategy: str, tokens: int, path: str) -> None:
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                         norm_topk_prob=norm_topk_prob, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=16, vocab_size=32)
    block, norm = qm.Qwen3MoeSparseMoeBlock(cfg).eval(), qm.Qwen3MoeRMSNorm(H, eps=cfg.rms_norm_eps).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
        norm.weight.normal_(1.0, 0.1)
    config = MoeBlockConfig(top_k=K, num_experts=E, num_local_experts=E, router_activation="softmax",
                            router_pre_norm=True, norm_topk_prob=norm_topk_prob, activation=ExpertActivation("silu"),
                            strategy=strategy)
    layer = MoeBlockLayer(norm.weight.data, block.gate.weight.data,
                          ExpertWeights("dense", block.experts.gate_up_proj.data, block.experts.down_proj.data), config)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, H, generator=g)
    with torch.no_grad():
        want = block(norm(x).unsqueeze(0)).squeeze(0)
    out = torch.empty(tokens, H + 5)[:, :H]
    moe_block_tkg(x, None, prepare_block(layer, path), cfg.rms_norm_eps, out)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert want.abs().max() > 0.1
