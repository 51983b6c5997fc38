"""Model profiles: the facts of real models that retarget references and thresholds.

Each profile states how a model routes (router activation, where top-K happens, renormalisation,
routed scaling), which expert activation it uses, whether its RMSNorm is Gemma-style ``(1+w)``,
whether it has a shared expert, and its real layer sizes for benchmarks. Diagnostic profiles use
small shapes with these semantics.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kernelslot.kernels.experts_spec import ExpertActivation


@dataclass(frozen=True)
class ModelProfile:
    name: str
    router: str  # "softmax": softmax over all E then top-K; "sigmoid": sigmoid scores;
    #              "topk_softmax": top-K on logits then softmax over the K
    norm_topk_prob: bool
    routed_scaling_factor: float
    activation: ExpertActivation
    gemma_norm: bool = False  # RMSNorm multiplies by (1 + w)
    shared_expert: bool = False
    correction_bias: bool = False  # selection on scores + e_score_correction_bias
    expert_format: str = "dense"
    sizes: dict = field(default_factory=dict)  # the real model's layer sizes (H, I, E, K, heads...)


MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile("generic", "softmax", False, 1.0, ExpertActivation("silu")),
        ModelProfile(
            "MiniMax-M3",
            "sigmoid",
            True,
            2.0,
            ExpertActivation.swigluoai(1.702, 7.0),
            gemma_norm=True,
            shared_expert=True,
            correction_bias=True,
            expert_format="nvfp4",
            sizes=dict(H=6144, E=128, K=4, I=3072, q_heads=64, kv_heads=4, head_dim=128,
                       msa_index_heads=4, msa_index_dim=128, msa_key_block=128, msa_top_blocks=16, msa_local_blocks=1),
        ),
        ModelProfile(
            "gpt-oss", "topk_softmax", False, 1.0, ExpertActivation.swigluoai(1.702, 7.0), expert_format="mxfp4",
            sizes=dict(H=2880, E=32, K=4, I=2880),
        ),
        ModelProfile("qwen3-moe", "softmax", True, 1.0, ExpertActivation("silu"), sizes=dict(H=2048, E=128, K=8, I=768)),
    )
}


# Spellings of a model that bundles use, beyond the profile names themselves (case-insensitive).
# ``<model>-<FORMAT>`` (e.g. ``MiniMax-M3-NVFP4``) names the model with its expert weights in
# FORMAT; ``__none__`` is the arena's spelling of "no model" (the generic profile).
MODEL_ALIASES = {"__none__": "generic", "none": "generic"}
WEIGHT_FORMATS = ("nvfp4", "mxfp4", "mxfp8", "fp8")


def resolve_model(name: str) -> tuple[str, str | None] | None:
    """``(profile name, weight format or None)`` for a model spelling, or None if unknown.

    ``MiniMax-M3`` -> ``("MiniMax-M3", None)``; ``MiniMax-M3-NVFP4`` -> ``("MiniMax-M3", "nvfp4")``.
    """
    if not isinstance(name, str):
        return None
    by_lower = {m.lower(): m for m in MODELS}
    token = MODEL_ALIASES.get(name.strip().lower(), name.strip()).lower()
    if token in by_lower:
        return by_lower[token], None
    base, _, fmt = token.rpartition("-")
    if base in by_lower and fmt in WEIGHT_FORMATS:
        return by_lower[base], fmt
    return None


def model_profile(name: str) -> ModelProfile:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model profile {name!r}; known: {', '.join(MODELS)}") from None
