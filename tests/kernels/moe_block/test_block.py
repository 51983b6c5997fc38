"""Block-level equivalences of the orchestrator: strategies, expert-parallel split, dtypes."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelslot.kernels.moe_block import (
    MoeBlockConfig, MoeBlockParams, ScalingMode, choose_strategy, moe_block_tkg, prepare_moe_block,
)
from kernelslot.kernels.experts_spec import ExpertWeights
from kernelslot.slots.base import Profile
from kernelslot.slots.moe_block import MoeBlockLayer, make_layer

MODELS = ("generic", "qwen3-moe", "gpt-oss", "MiniMax-M3")


@pytest.fixture(params=["prepared", "torch"])
def path(request: pytest.FixtureRequest) -> str:
    """``prepared``: through ``prepare_moe_block`` (the native leaves where they apply);
    ``torch``: params built directly on a fresh ExpertWeights object, so the torch leaves run."""
    return request.param


def _prepare(layer: MoeBlockLayer, path: str) -> MoeBlockParams:
    if path == "torch":
        fresh = dataclasses.replace(layer, experts=dataclasses.replace(layer.experts))
        return MoeBlockParams(**{f.name: getattr(fresh, f.name) for f in dataclasses.fields(fresh)})
    return prepare_moe_block("moe_block", layer)


def _layer(model: str, dtype=torch.float32, fmt: str = "dense", **dims) -> MoeBlockLayer:
    base = dict(T=6, H=64, I=32, E=8, K=3, format=fmt, biases=model == "gpt-oss")
    base.update(dims)
    return make_layer(Profile("t", base, dtype, model), torch.Generator().manual_seed(7))


def _run(layer: MoeBlockLayer, x: torch.Tensor, path: str, strategy: str | None = None) -> torch.Tensor:
    if strategy is not None:
        layer = dataclasses.replace(layer, config=dataclasses.replace(layer.config, strategy=strategy))
    out = torch.empty(x.shape, dtype=x.dtype)
    moe_block_tkg(x, None, _prepare(layer, path), 1e-6, out)
    return out


def _x(tokens: int = 6, hidden: int = 64, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(8)).to(dtype)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("fmt", ["dense", "mxfp4", "fp8_row"])
@pytest.mark.parametrize("scaling", [ScalingMode.POST_SCALE, ScalingMode.NO_SCALE])
def test_all_expert_equals_selective(model: str, fmt: str, scaling: ScalingMode, path: str) -> None:
    layer = _layer(model, fmt=fmt, scaling=scaling)
    x = _x()
    # the two strategies sum in different fp32 orders (and torch's matmul blocking changes with the thread count)
    torch.testing.assert_close(_run(layer, x, path, "all_expert"), _run(layer, x, path, "selective"),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("model", MODELS)
def test_expert_parallel_split_sums_to_the_unsplit_block(model: str, path: str) -> None:
    full = _layer(model, E=8, shared=False)
    x = _x()
    ranks = 4
    local = full.config.num_experts // ranks
    total = torch.zeros_like(x)
    for rank in range(ranks):
        sl = slice(rank * local, (rank + 1) * local)
        w = full.experts
        experts = ExpertWeights(w.format, w.gate_up[sl], w.down[sl],
                                gate_up_bias=None if w.gate_up_bias is None else w.gate_up_bias[sl],
                                down_bias=None if w.down_bias is None else w.down_bias[sl])
        strategy = "all_expert" if rank % 2 else "selective"
        cfg = dataclasses.replace(full.config, num_local_experts=local, rank_id=rank, strategy=strategy)
        total += _run(dataclasses.replace(full, experts=experts, config=cfg), x, path)
    torch.testing.assert_close(total, _run(full, x, path), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_half_precision_within_tolerance_of_fp32(model: str, dtype: torch.dtype, tol: float, path: str) -> None:
    layer32 = _layer(model)
    layer16 = _layer(model, dtype=dtype)
    x = _x()
    got = _run(layer16, x.to(dtype), path, "selective").float()
    want = _run(layer32, x.to(dtype).float(), path, "selective")
    rel = (got - want).norm() / want.norm()
    assert rel < tol, rel


def test_residual_and_router_logits_outputs(path: str) -> None:
    layer = _layer("MiniMax-M3", H=64)
    x, res = _x(), _x() * 0.5
    out = torch.empty(6, 70)[:, :64]
    out_res = torch.empty(6, 70)[:, :64]
    logits = torch.empty(6, 9)[:, :8]
    moe_block_tkg(x, res, _prepare(layer, path), 1e-6, out, out_res, logits)
    torch.testing.assert_close(out_res, x + res)
    torch.testing.assert_close(out, _run(layer, x + res, path), atol=1e-5, rtol=1e-5)
    s = x + res
    h = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * layer.gamma
    torch.testing.assert_close(logits, h @ layer.router_weight.t(), atol=1e-5, rtol=1e-5)


def test_routed_scaling_factor_applies_once_and_not_to_the_shared_expert(path: str) -> None:
    layer = _layer("MiniMax-M3")  # factor 2.0, shared expert
    x = _x()
    no_shared = dataclasses.replace(layer, shared=None)
    unit = dataclasses.replace(no_shared, config=dataclasses.replace(layer.config, routed_scaling_factor=1.0))
    routed2, routed1 = _run(no_shared, x, path), _run(unit, x, path)
    torch.testing.assert_close(routed2, 2.0 * routed1, atol=1e-5, rtol=1e-5)
    shared_only = _run(layer, x, path) - routed2
    assert shared_only.abs().max() > 1e-3  # the shared expert is really added


@pytest.mark.parametrize("mode", ["PRE_SCALE", "PRE_SCALE_DELAYED"])
def test_pre_scale_modes_rejected_with_a_clear_error(mode: str) -> None:
    with pytest.raises(ValueError, match=f"{mode} .*POST_SCALE or NO_SCALE"):
        MoeBlockConfig(top_k=2, num_experts=8, num_local_experts=8, scaling=mode)


def test_auto_strategy_rule() -> None:
    cfg = MoeBlockConfig(top_k=4, num_experts=128, num_local_experts=128)
    assert choose_strategy(cfg, 1) == "selective"
    assert choose_strategy(cfg, 32) == "all_expert"


def test_bad_layer_shapes_are_rejected() -> None:
    layer = _layer("generic")
    with pytest.raises(ValueError, match="router weight must be"):
        prepare_moe_block("moe_block", dataclasses.replace(layer, router_weight=layer.router_weight[:, :10]))
    with pytest.raises(ValueError, match="unknown layer kind"):
        prepare_moe_block("nvfp4_layer", layer)
    with pytest.raises(ValueError, match="rank_id"):
        MoeBlockConfig(top_k=2, num_experts=8, num_local_experts=4, rank_id=2)
