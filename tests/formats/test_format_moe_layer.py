"""The NVFP4 MoE layer view: SGLang field shapes, per-expert agreement with quantize_nvfp4,
the exact outer scale, the independent dequantiser, determinism, immutability checks."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelslot.formats import (
    Nvfp4MoeLayer,
    dequantize_moe_layer_nvfp4,
    dequantize_nvfp4,
    quantize_moe_layer_nvfp4,
    quantize_nvfp4,
    unswizzle_scales_128x4,
)

E, H, I = 3, 64, 96  # 2I = 192 and H = 64 rows: both need row padding to 128


def _weights(seed: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) * torch.tensor([0.02, 0.1, 1.0]).view(E, 1, 1)
    w2 = torch.randn(E, H, I, generator=g) * 0.05
    return w13, w2


def test_fields_shapes_and_dtypes() -> None:
    w13, w2 = _weights()
    layer = quantize_moe_layer_nvfp4(w13, w2, seed=0)
    assert layer.w13_weight.shape == (E, 2 * I, H // 2) and layer.w13_weight.dtype == torch.uint8
    assert layer.w2_weight.shape == (E, H, I // 2) and layer.w2_weight.dtype == torch.uint8
    assert layer.w13_weight_scale.shape == (E, 256, 4) and layer.w13_weight_scale.dtype == torch.float8_e4m3fn
    assert layer.w2_weight_scale.shape == (E, 128, 8) and layer.w2_weight_scale.dtype == torch.float8_e4m3fn
    for name in ("g1_alphas", "g2_alphas", "a1_inv", "a2_inv"):
        t = getattr(layer, name)
        assert t.shape == (E,) and t.dtype == torch.float32
    assert (layer.intermediate_size, layer.group_size, layer.layout) == (I, 16, "modelopt_gate_up")
    assert (layer.num_experts, layer.hidden_size) == (E, H)
    assert set(f.name for f in dataclasses.fields(layer)) == {
        "w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "g1_alphas",
        "g2_alphas", "a1_inv", "a2_inv", "intermediate_size", "group_size", "layout"}


def test_each_expert_is_quantize_nvfp4_of_its_matrix() -> None:
    w13, w2 = _weights()
    layer = quantize_moe_layer_nvfp4(w13, w2, seed=0)
    d13, d2 = dequantize_moe_layer_nvfp4(layer)
    for packed, swz, g, a_inv, dense, deq in (
        (layer.w13_weight, layer.w13_weight_scale, layer.g1_alphas, layer.a1_inv, w13, d13),
        (layer.w2_weight, layer.w2_weight_scale, layer.g2_alphas, layer.a2_inv, w2, d2),
    ):
        rows, cols = dense.shape[1:]
        logical = unswizzle_scales_128x4(swz, rows, cols // 16)
        for e in range(E):
            data, block_scales, ws2 = quantize_nvfp4(dense[e])
            assert torch.equal(packed[e], data)
            assert torch.equal(logical[e].view(torch.uint8), block_scales.view(torch.uint8))
            outer = g[e] * a_inv[e]
            assert outer.item() == ws2.item()  # bit-exact: input scales are powers of two
            assert torch.equal(deq[e], dequantize_nvfp4(data, block_scales, ws2))
        assert ((deq - dense).norm() / dense.norm()).item() < 0.15


def test_gate_rows_then_up_rows() -> None:
    w13, w2 = _weights()
    w13[:, I:] = 0.0  # up rows zero -> their packed bytes are zero, gate rows are not
    layer = quantize_moe_layer_nvfp4(w13, w2)
    assert int(layer.w13_weight[:, I:].sum()) == 0 and int(layer.w13_weight[:, :I].sum()) > 0


def test_input_scales_are_seeded_powers_of_two() -> None:
    w13, w2 = _weights()
    a = quantize_moe_layer_nvfp4(w13, w2, seed=7)
    b = quantize_moe_layer_nvfp4(w13, w2, generator=torch.Generator().manual_seed(7))
    c = quantize_moe_layer_nvfp4(w13, w2, seed=8)
    assert a.digest() == b.digest()
    assert not torch.equal(torch.cat([a.a1_inv, a.a2_inv]), torch.cat([c.a1_inv, c.a2_inv]))
    for inv in (a.a1_inv, a.a2_inv):
        mantissa, _ = torch.frexp(inv)
        assert (mantissa == 0.5).all()


def test_view_is_frozen_fresh_and_digest_catches_mutation() -> None:
    w13, w2 = _weights()
    before = (w13.clone(), w2.clone())
    layer = quantize_moe_layer_nvfp4(w13, w2)
    assert torch.equal(w13, before[0]) and torch.equal(w2, before[1])  # builder mutates nothing
    with pytest.raises(dataclasses.FrozenInstanceError):
        layer.w13_weight = layer.w2_weight  # type: ignore[misc]
    copy = layer.clone()
    assert copy.digest() == layer.digest()
    assert copy.w13_weight.data_ptr() != layer.w13_weight.data_ptr()
    copy.w13_weight_scale.view(torch.uint8)[0, 0, 0] ^= 1
    assert copy.digest() != layer.digest()


def test_validation_errors() -> None:
    w13, w2 = _weights()
    with pytest.raises(ValueError, match=r"implies w2 of shape"):
        quantize_moe_layer_nvfp4(w13, w2[:, :, :32])
    layer = quantize_moe_layer_nvfp4(w13, w2)
    with pytest.raises(ValueError, match="w2_weight_scale"):
        dataclasses.replace(layer, w2_weight_scale=layer.w13_weight_scale)
    with pytest.raises(ValueError, match="layout"):
        dataclasses.replace(layer, layout="gate_up_interleaved")
    with pytest.raises(ValueError, match="g1_alphas"):
        dataclasses.replace(layer, g1_alphas=layer.g1_alphas.double())
    with pytest.raises(ValueError, match="contiguous"):
        dataclasses.replace(layer, a1_inv=torch.ones(2 * E)[::2])
    assert isinstance(dataclasses.replace(layer), Nvfp4MoeLayer)
