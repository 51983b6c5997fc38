"""moe.block_tkg vs transformers' MiniMax-M3 text MoE block (random init, no download).

The engine side is the decoder layer's MLP half: ``s = x + residual``;
``mlp(post_attention_layernorm(s))``. The block gets ``x``, ``residual`` and the Gemma norm's
``1 + w`` as gamma; its ``out`` must match the MLP output and ``out_residual`` must be ``s``.
"""
from __future__ import annotations


import pytest
import torch

from kernelslot.kernels.moe_block import MoeBlockConfig, SharedExpert, moe_block_tkg
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.slots.moe_block import MoeBlockLayer
from tests.helpers import prepare_block

mm3 = pytest.importorskip("transformers.models.minimax_m3_vl.modeling_minimax_m3_vl")
from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import MiniMaxM3VLTextConfig  # noqa: E402

H, I, E, K = 64, 32, 8, 3


def _engine(seed: int):
    torch.manual_seed(seed)
    cfg = MiniMaxM3VLTextConfig(hidden_size=H, intermediate_size=I, shared_intermediate_size=48, num_local_experts=E,
                                num_experts_per_tok=K, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1,
                                head_dim=16, vocab_size=32)
    block, norm = mm3.MiniMaxM3VLSparseMoeBlock(cfg), mm3.MiniMaxM3VLRMSNorm(H, eps=cfg.rms_norm_eps)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
        block.gate.e_score_correction_bias.normal_(0.0, 0.1)
        norm.weight.normal_(0.0, 0.1)
    return cfg, block.eval(), norm.eval()


def _layer(cfg, block, norm, strategy: str) -> MoeBlockLayer:
    act = ExpertActivation.swigluoai(cfg.swiglu_alpha, cfg.swiglu_limit)
    sh = block.shared_experts
    shared = SharedExpert(ExpertWeights("dense", sh.gate_up_proj.weight.data[None], sh.down_proj.weight.data[None]), act)
    config = MoeBlockConfig(top_k=K, num_experts=E, num_local_experts=E, router_activation="sigmoid", router_pre_norm=True,
                            norm_topk_prob=True, activation=act, routed_scaling_factor=cfg.routed_scaling_factor,
                            strategy=strategy)
    experts = ExpertWeights("dense", block.experts.gate_up_proj.data, block.experts.down_proj.data)
    return MoeBlockLayer(1.0 + norm.weight.data, block.gate.weight.data, experts, config,
                         correction_bias=block.gate.e_score_correction_bias.data, shared=shared)


@pytest.mark.parametrize("path", ["prepared", "torch"])
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("strategy", ["selective", "all_expert"])
def test_block_matches_minimax_m3_post_attention_norm_plus_moe(tokens: int, strategy: str, path: str) -> None:
    cfg, block, norm = _engine(0)
    g = torch.Generator().manual_seed(1)
    x, residual = torch.randn(tokens, H, generator=g), torch.randn(tokens, H, generator=g)
    with torch.no_grad():
        s = x + residual
        want = block(norm(s).unsqueeze(0)).squeeze(0)
        logits_want = torch.nn.functional.linear(norm(s), block.gate.weight)
    out, out_res, logits = torch.empty(tokens, H), torch.empty(tokens, H), torch.empty(tokens, E)
    moe_block_tkg(x, residual, prepare_block(_layer(cfg, block, norm, strategy), path), cfg.rms_norm_eps,
                  out, out_res, logits)
    torch.testing.assert_close(out_res, s)
    torch.testing.assert_close(logits, logits_want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert want.abs().max() > 0.1  # the comparison is not between near-zero tensors
