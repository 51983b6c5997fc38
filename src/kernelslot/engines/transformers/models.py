"""Small random-weight configurations of real transformers model classes (built offline).

Each builder returns a ``*ForCausalLM`` of the real class with seeded weights: a few layers,
MoE in every layer, hidden sizes that are multiples of 32 (so the native MXFP4/bf16 paths
apply), untied embeddings (so the LM head can be sharpened alone). ``sizes`` overrides the
dimensions (the benchmark uses real layer widths).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

MODEL_CLASSES = ("qwen3-moe", "mixtral", "deepseek-v3", "minimax-m3", "gpt-oss", "olmoe")
_BASE = dict(hidden=64, inter=32, experts=8, top_k=2, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=96)


def _qwen3_moe(s: dict) -> Any:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(hidden_size=s["hidden"], moe_intermediate_size=s["inter"], intermediate_size=s["inter"],
                         num_experts=s["experts"], num_experts_per_tok=s["top_k"], norm_topk_prob=True,
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], vocab_size=s["vocab"],
                         tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[])
    return Qwen3MoeForCausalLM, cfg


def _mixtral(s: dict) -> Any:
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(hidden_size=s["hidden"], intermediate_size=s["inter"], num_local_experts=s["experts"],
                        num_experts_per_tok=s["top_k"], num_hidden_layers=s["layers"],
                        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
                        vocab_size=s["vocab"], tie_word_embeddings=False, sliding_window=None)
    return MixtralForCausalLM, cfg


def _deepseek_v3(s: dict) -> Any:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(hidden_size=s["hidden"], intermediate_size=2 * s["inter"], moe_intermediate_size=s["inter"],
                           n_routed_experts=s["experts"], num_experts_per_tok=s["top_k"], n_group=2, topk_group=1,
                           n_shared_experts=1, first_k_dense_replace=0, num_hidden_layers=s["layers"],
                           num_attention_heads=s["heads"], num_key_value_heads=s["heads"], q_lora_rank=None,
                           kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                           vocab_size=s["vocab"], tie_word_embeddings=False, num_nextn_predict_layers=0)
    return DeepseekV3ForCausalLM, cfg


def _minimax_m3(s: dict) -> Any:
    from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import MiniMaxM3VLTextConfig
    from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import MiniMaxM3VLForCausalLM

    cfg = MiniMaxM3VLTextConfig(hidden_size=s["hidden"], intermediate_size=s["inter"],
                                shared_intermediate_size=s["inter"], num_local_experts=s["experts"],
                                num_experts_per_tok=s["top_k"], num_hidden_layers=s["layers"],
                                num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                                head_dim=s["head_dim"], vocab_size=s["vocab"], tie_word_embeddings=False,
                                mlp_layer_types=["sparse"] * s["layers"], bos_token_id=None, eos_token_id=None)
    return MiniMaxM3VLForCausalLM, cfg


def _gpt_oss(s: dict) -> Any:
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(hidden_size=s["hidden"], intermediate_size=s["inter"], num_local_experts=s["experts"],
                       num_experts_per_tok=s["top_k"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                       num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], vocab_size=s["vocab"],
                       tie_word_embeddings=False, layer_types=["full_attention"] * s["layers"])
    return GptOssForCausalLM, cfg


def _olmoe(s: dict) -> Any:
    """OLMoE: softmax over all experts, top-K, no renormalisation, SiLU, no shared expert — the
    ``generic`` profile's MoE block (the one class here whose block is generic)."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    cfg = OlmoeConfig(hidden_size=s["hidden"], intermediate_size=s["inter"], num_experts=s["experts"],
                      num_experts_per_tok=s["top_k"], norm_topk_prob=False, num_hidden_layers=s["layers"],
                      num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], vocab_size=s["vocab"],
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return OlmoeForCausalLM, cfg


BUILDERS: dict[str, Callable[[dict], Any]] = {
    "qwen3-moe": _qwen3_moe, "mixtral": _mixtral, "deepseek-v3": _deepseek_v3,
    "minimax-m3": _minimax_m3, "gpt-oss": _gpt_oss, "olmoe": _olmoe,
}


def build_model(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, sizes: dict | None = None,
                experts_implementation: str = "eager", attn_implementation: str | None = None,
                weight_std: float = 0.1) -> torch.nn.Module:
    """The model class ``name`` (one of :data:`MODEL_CLASSES`) with seeded normal weights."""
    if name not in BUILDERS:
        raise ValueError(f"unknown model class {name!r}; known: {', '.join(MODEL_CLASSES)}")
    cls, cfg = BUILDERS[name]({**_BASE, **(sizes or {})})
    cfg.bos_token_id = cfg.eos_token_id = cfg.pad_token_id = None
    # GPT-OSS has attention sinks, which transformers' sdpa does not take: eager there
    cfg._attn_implementation = attn_implementation or ("eager" if name == "gpt-oss" else "sdpa")
    cfg._experts_implementation = experts_implementation
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in the target dtype: no full fp32 copy at real widths
    try:
        model = cls(cfg).eval()
    finally:
        torch.set_default_dtype(previous)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1 and "norm" in pname or pname.endswith("layernorm.weight"):
                continue  # norms keep their initialisation (1, or 0 for (1+w) norms)
            for part in (p if p.dim() == 3 else p[None]):  # one expert at a time
                part.copy_(torch.randn(part.shape, generator=gen) * weight_std)
        for b_name, b in model.named_buffers():
            if b_name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.05)
    return model
