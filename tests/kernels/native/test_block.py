"""The whole decode block in one native call (kernels/native/block.py, ks_block.c) against the
torch block (stage-by-stage Python on the torch leaves), on every model profile, format,
router mode, dtype, residual / logits output, expert-parallel rank and scaling mode."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelslot.kernels import native
from kernelslot.kernels.moe_block import MoeBlockParams, ScalingMode, experts_dispatch, moe_block_tkg, prepare_moe_block
from kernelslot.kernels.native import block as native_block_mod
from kernelslot.slots.base import Profile
from kernelslot.slots.moe_block import make_layer

pytestmark = pytest.mark.skipif(not native.native_status()[0], reason="native path unavailable")
MODELS = ("generic", "qwen3-moe", "gpt-oss", "MiniMax-M3")


@pytest.fixture
def calls(monkeypatch):
    seen = []
    real = native_block_mod.moe_block_native

    def spy(*a, **k):
        ran = real(*a, **k)
        seen.append(ran)
        return ran
    monkeypatch.setattr(native_block_mod, "moe_block_native", spy)
    return seen


def _torch_params(layer) -> MoeBlockParams:
    fresh = dataclasses.replace(layer, experts=dataclasses.replace(layer.experts))
    if fresh.shared is not None:
        fresh = dataclasses.replace(fresh, shared=dataclasses.replace(
            fresh.shared, weights=dataclasses.replace(fresh.shared.weights)))
    return MoeBlockParams(**{f.name: getattr(fresh, f.name) for f in dataclasses.fields(fresh)})


def _run(params, x, residual, with_logits):
    out = torch.empty(x.shape, dtype=x.dtype)
    out_res = torch.empty(x.shape, dtype=x.dtype) if residual is not None else None
    logits = torch.empty(x.shape[0], params.config.num_experts, dtype=x.dtype) if with_logits else None
    moe_block_tkg(x, residual, params, 1e-6, out, out_res, logits)
    return out, out_res, logits


def _check(layer, dtype, T=6, residual=True, logits=True, calls=None):
    gen = torch.Generator().manual_seed(3)
    H = layer.experts.hidden_size
    x = torch.randn(T, H, generator=gen).to(dtype)
    res = torch.randn(T, H, generator=gen).to(dtype) if residual else None
    fast = prepare_moe_block("moe_block", layer)
    assert id(fast) in experts_dispatch._BLOCKS
    got = _run(fast, x, res, logits)
    want = _run(_torch_params(layer), x, res, logits)
    assert calls and calls[-1] is True
    mx = layer.experts.format in ("mxfp4", "mxfp8")
    if res is not None:
        assert torch.equal(got[1], want[1])
    if logits:
        torch.testing.assert_close(got[2], want[2], atol=1e-4 if dtype == torch.float32 else 2e-2, rtol=1e-3)
    a, b = got[0].double(), want[0].double()
    rel = ((a - b).norm() / b.norm()).item()
    assert rel < (3e-2 if mx else 1e-4 if dtype == torch.float32 else 2e-2), rel


def _layer(model, fmt="dense", dtype=torch.float32, **dims):
    base = dict(T=6, H=64, I=32, E=8, K=3, format=fmt, biases=model == "gpt-oss")
    base.update(dims)
    return make_layer(Profile("t", base, dtype, model), torch.Generator().manual_seed(7))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("fmt", ["dense", "mxfp4", "nvfp4", "fp8_row", "mxfp8"])
def test_block_matches_torch_block(model, fmt, calls):
    dtype = torch.bfloat16 if fmt in ("mxfp4", "mxfp8") else torch.float32
    _check(_layer(model, fmt, dtype), dtype, calls=calls)


@pytest.mark.parametrize("pre_norm", [True, False])
@pytest.mark.parametrize("act", ["sigmoid", "softmax"])
@pytest.mark.parametrize("norm_topk", [True, False])
def test_every_router_mode(pre_norm, act, norm_topk, calls):
    layer = _layer("MiniMax-M3")  # router and correction biases, shared expert
    cfg = dataclasses.replace(layer.config, router_activation=act, router_pre_norm=pre_norm, norm_topk_prob=norm_topk)
    _check(dataclasses.replace(layer, config=cfg), torch.float32, calls=calls)


@pytest.mark.parametrize("scaling", [ScalingMode.POST_SCALE, ScalingMode.NO_SCALE])
@pytest.mark.parametrize("rank", [0, 1])
def test_rank_slices_scaling_bf16_no_residual(scaling, rank, calls):
    layer = _layer("qwen3-moe", "nvfp4", torch.bfloat16, E_L=4, rank=rank, scaling=scaling, T=9)
    _check(layer, torch.bfloat16, T=9, residual=False, logits=False, calls=calls)


def test_out_of_domain_calls_fall_back(calls):
    layer = _layer("generic")
    params = prepare_moe_block("moe_block", layer)
    x = torch.randn(65, 64)
    out = torch.empty(65, 64)
    moe_block_tkg(x, None, params, 1e-6, out)   # T = 65 > 64: the torch block
    assert calls == [False]
    want = torch.empty(65, 64)
    moe_block_tkg(x, None, _torch_params(layer), 1e-6, want)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
