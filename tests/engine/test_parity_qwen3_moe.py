"""moe.block_tkg vs transformers' Qwen3-MoE sparse MoE block (random init, no download).

Both ``norm_topk_prob`` settings: with ``False`` the router leaves dense softmax affinities,
so the all-expert strategy depends on the keystone index mask to match the engine.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelslot.kernels.moe_block import MoeBlockConfig, MoeBlockParams, moe_block_tkg, prepare_moe_block
from kernelslot.kernels.moe_block.spec import ExpertActivation, ExpertWeights
from kernelslot.slots.moe_block import MoeBlockLayer

qm = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
from transformers import Qwen3MoeConfig  # noqa: E402

H, I, E, K = 64, 32, 8, 2


def _prepare(layer: MoeBlockLayer, path: str) -> MoeBlockParams:
    """``prepared``: the slot's prepare (native leaves where they apply); ``torch``: params on a
    fresh ExpertWeights object (no native layout attached), so the torch leaves run."""
    if path == "torch":
        fresh = dataclasses.replace(layer, experts=dataclasses.replace(layer.experts))
        return MoeBlockParams(**{f.name: getattr(fresh, f.name) for f in dataclasses.fields(fresh)})
    return prepare_moe_block("moe_block", layer)


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
    moe_block_tkg(x, None, _prepare(layer, path), cfg.rms_norm_eps, out)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert want.abs().max() > 0.1
